"""Sticky, balanced, deterministic shard assignor for the Redis Stream Coordinator.

Pure Python, no Django, no I/O: ``assign()`` maps the current set of live members and
assignable shards (plus the previous target) to a new target ``shard_id -> member_id``.

Guarantees (all covered by ``tests/unit/test_assignor.py``):

* Valid: every shard goes to exactly one live member; no other keys. No members -> ``{}``.
* Balanced: with ``n`` members and ``m`` shards, ``q, r = divmod(m, n)``; exactly ``r``
  members get ``q + 1`` shards and the rest get ``q``.
* Minimal movement: among all balanced assignments, the result changes the owner of the
  fewest shards relative to ``previous``. A member's "held" count is the number of current
  shards that ``previous`` gives it. Each member keeps ``min(held, quota)`` of them, and the
  ``r`` "+1" quotas go to the members with the highest held count (ties: smaller member id),
  because a +1 only saves a move for a member holding more than ``q``. That maximises
  ``sum(min(held, quota))``, i.e. the number of shards that stay put.
* Deterministic: the result (including its iteration order) depends only on the *sets* of
  members and shards and on ``previous``, never on input order.

Canonical shard order ("natural order"), used to decide which shards an over-quota member
keeps (the first ones) and which free shard goes to which member: shard ids are split on
``':'`` and every segment made only of ASCII digits is left-padded with zeros to a common
width; the padded ids are compared as plain strings, and ties (e.g. ``"a:3"`` vs
``"a:03"``) are broken by the raw id. So ``"orders:3:9" < "orders:3:10" < "orders:10:0"``.
Free shards are handed out in that order, in contiguous runs, to members that still have
room, taken in member-id order.

Cost: O(m log m) string comparisons for the one sort of shard ids (keys computed once per
shard) plus O(m + n log n) for the rest.

``reassign()`` computes the same result as a change list from each member's previous shards,
in O(n log n + k log k) for the k shards that move once the shard set's natural order is
known. ``reassign_by_count()`` computes it again from the members grouped by their previous
count (a roster the coordinator keeps up to date), touching only the members whose count is
not their quota: a join or leave in a settled group then costs the change, not the group's
size (issue 26.2).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import TypeVar, cast

T = TypeVar("T")

__all__ = ["assign", "reassign", "reassign_by_count"]


def _natural_order(shards: set[str]) -> list[str]:
    """Shard ids in natural order (see module docstring).

    The coordinator recomputes the target of one group many times over the same assignable
    set (every join and leave), so the last few orders are kept, keyed by the set itself.
    """
    key = frozenset(shards)
    hit = _order_cache.get(key)
    if hit is None:
        hit = _sort_naturally(list(shards))
        if len(_order_cache) >= 8:
            _order_cache.pop(next(iter(_order_cache)))
        _order_cache[key] = hit
    return list(hit)


_order_cache: dict[frozenset[str], tuple[str, ...]] = {}
_rank_cache: dict[frozenset[str], dict[str, int]] = {}


def _natural_rank(shards: frozenset[str]) -> dict[str, int]:
    """Each shard's position in natural order, kept for the last few shard sets (a caller
    that passes the same frozenset object each time pays no hashing either)."""
    hit = _rank_cache.get(shards)
    if hit is None:
        hit = {shard: i for i, shard in enumerate(_natural_order(set(shards)))}
        if len(_rank_cache) >= 8:
            _rank_cache.pop(next(iter(_rank_cache)))
        _rank_cache[shards] = hit
    return hit


def _sort_naturally(ids: list[str]) -> tuple[str, ...]:
    # Widest all-digit segment. One C-level split of the joined ids is much cheaper than
    # tracking the maximum in the per-shard loop below; non-ASCII digits only overestimate.
    segments = ":".join(ids).split(":")
    width = max(map(len, filter(str.isdigit, segments)), default=0)

    def padded(shard: str) -> str:
        # Zero-padding to a shared width turns numeric comparison into plain string
        # comparison, which sorts several times faster than tuples of mixed int/str parts.
        return ":".join(
            [p.zfill(width) if p.isdigit() and p.isascii() else p for p in shard.split(":")]
        )

    keys = list(map(padded, ids))
    by_key = dict(zip(keys, ids, strict=True))
    if len(by_key) == len(ids):
        # Usual case, keys are unique: sorting bare strings is the cheapest sort there is.
        return tuple(map(by_key.__getitem__, sorted(by_key)))
    # Some ids pad to the same key ("a:3", "a:03"): break those ties on the raw id.
    return tuple(shard for _, shard in sorted(zip(keys, ids, strict=True)))


def assign(
    members: Sequence[str],
    shards: Sequence[str],
    previous: Mapping[str, str | None],
    reserved: Collection[str] = (),
) -> dict[str, str]:
    """Return the target assignment shard_id -> member_id.

    members: ids of live members (any order, unique). shards: assignable shard ids (any
    order, unique). previous: the previous target, shard_id -> member_id (may mention
    members/shards that no longer exist, or None values). reserved: members among `members`
    whose previous shards are kept exactly as they are (PROTOCOL §9: a temporarily left
    static member, or the member taking its place); they get nothing else.

    The result is valid, balanced (counts differ by at most one) among the members that are
    not reserved, over the shards not reserved, moves the minimum possible number of shards
    away from their previous member, and is deterministic; its iteration order is the
    natural shard order. See the module docstring for details.
    """
    if reserved:
        return _assign_around(members, shards, previous, set(reserved) & set(members))
    # Sorting the de-duplicated sets is what makes the result independent of input order.
    live = sorted(set(members))
    if not live:
        return {}
    order = _natural_order(set(shards))
    return _balance(live, order, previous)


def _assign_around(
    members: Sequence[str], shards: Sequence[str], previous: Mapping[str, str | None],
    reserved: set[str],
) -> dict[str, str]:
    """Keep the reserved members' previous shards; balance the rest over everyone else."""
    order = _natural_order(set(shards))
    kept = {shard: previous[shard] for shard in order if previous.get(shard) in reserved}
    others = sorted(set(members) - reserved)
    rest = _balance(others, [s for s in order if s not in kept], previous) if others else {}
    return {s: owner for s in order if (owner := kept.get(s) or rest.get(s)) is not None}


def _balance(live: list[str], order: list[str], previous: Mapping[str, str | None]) -> dict[str, str]:
    """The balanced, sticky assignment of `order` (natural order) over `live` (sorted)."""
    quota, extra = divmod(len(order), len(live))

    owners: list[str | None] = [previous.get(shard) for shard in order]
    # Counter over the owner column runs in C; dead members and None are filtered below.
    counts = Counter(owners)
    held = {member: counts.get(member, 0) for member in live}

    # The r "+1" quotas only save a move for members holding more than q, so hand them to
    # the biggest previous holders first; member id breaks ties deterministically.
    room: dict[str | None, int] = dict.fromkeys(live, quota)
    # (`live` is sorted and the sort stable, reverse included: count first, then id.)
    for member in sorted(live, key=held.__getitem__, reverse=True)[:extra]:
        room[member] = quota + 1

    # Keep previous owners while they have room; everything else is free. Walking shards in
    # natural order means an over-quota member keeps its lowest shards.
    free: list[int] = []
    for index, owner in enumerate(owners):
        left = room.get(owner, 0)  # None and dead members have no room
        if left:
            room[owner] = left - 1
        else:
            free.append(index)

    for index, member in _fill(live, room, free):
        owners[index] = member

    # Every slot is filled now: kept owners are live, the rest were just handed out.
    return dict(zip(order, cast("list[str]", owners), strict=True))


def reassign(
    members: Collection[str],
    shards: frozenset[str],
    held: Mapping[str, Collection[str]],
    unowned: Collection[str],
    reserved: Collection[str] = (),
) -> dict[str, str]:
    """The shards whose member ``assign()`` would change, with their new member.

    Same inputs as ``assign()``, given per member instead of per shard: ``held[member]`` is
    the previous shards of each live member (all of them in ``shards``; entries of other
    members are ignored, so a target map of every member will do), ``unowned`` the
    shards of ``shards`` whose previous member is None or not live; together they cover
    ``shards`` exactly once. Then, with ``previous`` the mapping they describe,
    ``assign(members, shards, previous, reserved)`` equals ``previous`` updated with the
    result, less the ``unowned`` shards it leaves out (only when every member is reserved).
    Cost O(n log n + k log k) for n members and k shards that move (the shard set's natural
    order is computed once per set and kept), where ``assign()`` walks all m shards.
    """
    live = set(members)
    keep = set(reserved) & live
    others = sorted(live - keep)
    if not others:
        return {}
    rank = _natural_rank(shards).__getitem__
    count = {member: len(held.get(member, ())) for member in others}
    quota, extra = divmod(len(shards) - sum(len(held.get(r, ())) for r in keep), len(others))
    # As in _balance: the "+1" quotas go to the biggest previous holders, then smaller ids.
    room = dict.fromkeys(others, quota)
    if extra:
        # `others` is in id order and the sort is stable, reverse included: by count, biggest
        # first, then by id (a C-level key: this runs over every member on each join).
        for member in sorted(others, key=count.__getitem__, reverse=True)[:extra]:
            room[member] = quota + 1
    # An over-quota member keeps its naturally smallest shards; the rest are free.
    free = list(unowned)
    for member in others:
        over = count[member] - room[member]
        if over > 0:
            free.extend(sorted(held[member], key=rank)[room[member]:])
            room[member] = 0
        else:
            room[member] = -over
    free.sort(key=rank)
    # A free shard never goes back to its previous member: it has no room left, or had none.
    return dict(_fill(others, room, free))


def reassign_by_count(
    buckets: Mapping[int, Sequence[str]],
    held: Mapping[str, Collection[str]],
    total: int,
    shards: frozenset[str],
    unowned: Collection[str],
) -> dict[str, str]:
    """``reassign()`` without reserved members, from the members grouped by previous count.

    ``buckets[c]``: the ids, in order, of the members that previously held ``c`` shards (every
    member to balance over is in exactly one bucket); ``held[member]`` their shards (all in
    ``shards``); ``total`` the number of shards to share among them (``shards`` less the
    reserved members' ones); ``unowned`` the shards of ``total`` no bucket member holds. The
    result equals ``reassign(members, shards, held, unowned, reserved)`` for the same group.

    Quotas are handed out as in ``_balance``: the ``extra`` "+1" quotas to the biggest holders,
    smaller ids first, which is the buckets in descending count, each in id order. Within a
    bucket of count ``c`` only the members whose quota is not ``c`` give or take shards, and
    those are a prefix or a suffix of the bucket: in a settled group (counts q and q + 1) a
    join touches a handful of members, whatever the group's size. Cost O(d log d + t + k log k)
    for d distinct counts, t members touched and k shards that move.
    """
    n = sum(map(len, buckets.values()))
    if not n:
        return {}
    quota, extra = divmod(total, n)
    rank = _natural_rank(shards).__getitem__
    free = list(unowned)
    needy: list[tuple[str, int]] = []
    for count in sorted(buckets, reverse=True):
        ids = buckets[count]
        plus = min(extra, len(ids))  # the first `plus` of this bucket may hold quota + 1
        extra -= plus
        if count == quota + 1:
            touched = [(m, quota) for m in ids[plus:]]
        elif count == quota:
            touched = [(m, quota + 1) for m in ids[:plus]]
        else:
            touched = [(m, quota + 1) for m in ids[:plus]] + [(m, quota) for m in ids[plus:]]
        for member, room in touched:
            if count > room:  # an over-quota member keeps its naturally smallest shards
                free.extend(sorted(held[member], key=rank)[room:])
            else:
                needy.append((member, room - count))
    free.sort(key=rank)
    needy.sort()
    return dict(_fill([m for m, _ in needy], dict(needy), free))


def _fill(
    members: list[str], room: Mapping[str, int] | Mapping[str | None, int], free: list[T]
) -> Iterator[tuple[T, str]]:
    """Free items, in natural order, fill the remaining room of the members in id order. Total
    room equals len(free) because the quotas sum to the number of shards."""
    start = 0
    for member in members:
        left = room[member]
        if left:
            for item in free[start:start + left]:
                yield item, member
            start += left
