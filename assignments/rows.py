"""Rows -> core: a group's protocol state read from the database as `coordination.model`
objects, and the row ids saving needs (`Loaded`).

The only code that turns group, member and slot rows into the core's objects;
`assignments.writer` writes what the core changed back (the one writer), and
`assignments.snapshot_cache` keeps each process's last state of a group current from the
rows written after it. Callers hold the group's row lock (`lock_group`) for the whole
load -> core -> save sequence.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, overload

from django.conf import settings
from django.db import connection
from django.db.backends.utils import CursorWrapper

from assignments.models import ShardAssignment, SQLValue
from coordination.model import LIVE_STATUSES, GroupState, Member, MemberStatus, ShardSlot
from coordinator_project.process_state import PROCESS, ProcessCache
from groups.models import Group, Installation, Shard, ShardVersion, VersionState
from members.models import Member as MemberRow

LIVE = [s.value for s in LIVE_STATUSES]


@dataclass
class Loaded:
    """Row ids behind the loaded state, so saving touches rows by primary key."""

    group: Group
    member_pk: dict[str, int] = field(default_factory=dict)
    # Members a slot names (owner or target) that were not loaded: a tombstone whose target a
    # deferred recompute has not moved yet (R1b).
    other_pk: dict[str, int] = field(default_factory=dict)
    slot_pk: dict[str, int] = field(default_factory=dict)
    drained_at: dict[str, datetime] = field(default_factory=dict)
    # Each member's row as read (raw, `MEMBER_COLUMNS`) and its columns as last written:
    # saving writes only the columns the core changed, so a snapshot's older last-seen of a
    # member is never written back over a newer stamp.
    member_rows: dict[str, tuple] = field(default_factory=dict)
    member_values: dict[str, dict[str, object]] = field(default_factory=dict)


def lock_group(name: str) -> Group | None:
    """Take the group's row lock (held until the surrounding transaction ends)."""
    # of=("self",): without it FOR UPDATE also locks the joined stream row, which serialises
    # every group of a stream and deadlocks with resharding (stream lock, then group locks).
    return Group.objects.select_for_update(of=("self",)).select_related("stream").filter(name=name).first()


@dataclass(frozen=True)
class _ShardInfo:
    shard_id: str
    parents: tuple[str, ...]
    sealed: bool


_catalogue: ProcessCache[tuple[int, int], dict[int, _ShardInfo]] = PROCESS.own(
    "shard catalogue", ProcessCache(),
    "The static part of a stream's shards. key: (stream id, stream metadataEpoch); bound: 256"
    " entries, then emptied; invalidated: a new stream metadataEpoch (every change of versions"
    " raises it); N hosts: every host reads the same rows for one epoch.",
)


def shard_catalogue(stream_id: int, metadata_epoch: int, need: set[int]) -> dict[int, _ShardInfo]:
    key = (stream_id, metadata_epoch)
    cat = _catalogue.get(key)
    if cat is None or not need <= cat.keys():
        rows = Shard.objects.filter(version__stream_id=stream_id).exclude(
            version__state=VersionState.RETIRED
        ).values_list("id", "shard_id", "parents", "version__state")
        cat = {
            pk: _ShardInfo(sid, tuple(parents or ()), vstate == VersionState.SEALED)
            for pk, sid, parents, vstate in rows
        }
        if len(_catalogue) > 256:
            _catalogue.clear()
        _catalogue[key] = cat
    return cat


def name_unloaded(cursor: CursorWrapper, pk_member: dict[int, str], loaded: Loaded, pks: set[int | None]) -> None:
    """Read the names of the members slots refer to that are not in `pk_member` (one query,
    only when there are any); they go in `loaded.other_pk`, so saving maps them back."""
    unknown = sorted(pk for pk in pks if pk is not None and pk not in pk_member)
    if not unknown:
        return
    cursor.execute(
        f"SELECT id, member_id FROM {MemberRow._meta.db_table} WHERE id IN {in_list(unknown)}", unknown
    )
    for pk, mid in cursor.fetchall():
        pk_member[pk] = mid
        loaded.other_pk[mid] = pk


def referenced_members(slot_rows: list[tuple]) -> set[int | None]:
    return {row[2] for row in slot_rows} | {row[5] for row in slot_rows}


def row_id_of(loaded: Loaded, name: str | None) -> int | None:
    if name is None:
        return None
    pk = loaded.member_pk.get(name)
    return pk if pk is not None else loaded.other_pk[name]


def in_list(values: Sequence[object]) -> str:
    """A portable IN list (SQLite has no = ANY); (NULL) matches nothing."""
    return "(" + ", ".join(["%s"] * len(values)) + ")" if values else "(NULL)"


@overload
def _aware(value: datetime) -> datetime: ...
@overload
def _aware(value: datetime | None) -> datetime | None: ...
def _aware(value: datetime | None) -> datetime | None:
    # Raw SQLite rows carry naive UTC datetimes (the ORM would attach the zone).
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


MEMBER_COLUMNS = (
    "id", "member_id", "status", "member_epoch", "previous_member_epoch", "client_id",
    "rebalance_timeout_ms", "last_heartbeat_at", "revocation_deadline",
    "fenced_reason", "fenced_by", "instance_id",
)


def member_from_row(row: tuple, reports: dict[str, list[str]]) -> Member:
    (_pk, mid, status, epoch, prev, client_id, rto, last_hb, deadline_at, reason, by, instance_id) = row
    return Member(
        member_id=mid,
        status=MemberStatus(status),
        member_epoch=epoch,
        previous_member_epoch=prev,
        client_id=client_id,
        rebalance_timeout_ms=rto,
        joined_at=None,  # not needed by the core; written only when a join sets it
        last_heartbeat_at=_aware(last_hb),
        revocation_deadline=_aware(deadline_at),
        # Only the heartbeating member's last report matters (R3, ownedShards null).
        last_reported_owned=tuple(reports[mid]) if mid in reports else None,
        fenced_reason=reason,
        fenced_by=by,
        instance_id=instance_id,
    )


def slot_from_row(
    row: tuple, catalogue: dict[int, _ShardInfo], pk_member: dict[int, str], loaded: Loaded
) -> ShardSlot | None:
    pk, shard_pk, owner, revoking, grant_epoch, target, drained_at = row
    info = catalogue.get(shard_pk)
    if info is None:  # a retired version's leftover row
        return None
    loaded.slot_pk[info.shard_id] = pk
    if drained_at is not None:
        loaded.drained_at[info.shard_id] = _aware(drained_at)
    else:
        loaded.drained_at.pop(info.shard_id, None)
    return ShardSlot(
        shard_id=info.shard_id,
        parents=info.parents,
        sealed=info.sealed,
        owner=None if owner is None else pk_member[owner],
        revoking=revoking,
        grant_epoch=grant_epoch,
        target=None if target is None else pk_member[target],
        drained=drained_at is not None,
    )


def _reports(cursor: CursorWrapper, group: Group, member_ids: list[str]) -> dict[str, list[str]]:
    if not member_ids:
        return {}
    cursor.execute(
        f"SELECT member_id, last_reported_owned FROM {MemberRow._meta.db_table}"
        f" WHERE group_id = %s AND member_id IN {in_list(member_ids)}",
        [group.pk, *member_ids],
    )
    return {mid: owned if isinstance(owned, list) else json.loads(owned or "[]")
            for mid, owned in cursor.fetchall()}


MEMBER_SQL = f"SELECT {', '.join(MEMBER_COLUMNS)} FROM {MemberRow._meta.db_table} WHERE group_id = %s"
_MEMBER_WITH_REPORT_SQL = (
    f"SELECT {', '.join(MEMBER_COLUMNS)}, last_reported_owned FROM {MemberRow._meta.db_table}"
    " WHERE group_id = %s AND member_id IN "
)


def heartbeating_members(member_id: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """The heartbeating members of a locked pass: none (a sweep), one, or a batch."""
    if member_id is None:
        return ()
    return (member_id,) if isinstance(member_id, str) else tuple(dict.fromkeys(member_id))


def members_with_reports(group_pk: int, member_ids: tuple[str, ...]) -> tuple[str, list[SQLValue]]:
    """The statement and parameters reading these members' rows with their last reports."""
    return _MEMBER_WITH_REPORT_SQL + in_list(member_ids), [group_pk, *member_ids]


SLOT_SQL = (
    "SELECT id, shard_id, owner_id, revoking, grant_epoch, target_id, drained_at"
    f" FROM {ShardAssignment._meta.db_table} WHERE group_id = %s"
)


def load_state(
    group: Group, member_id: str | tuple[str, ...] | None = None, *, lock_members: bool = False
) -> tuple[GroupState, Loaded]:
    """The group's snapshot: live members (plus `member_id`'s row whatever its status, with its
    last report: the heartbeating member, or each of a batch of them) and every slot.

    `lock_members` row-locks the members too: sweeps use it so a concurrent lock-free steady
    heartbeat (fastpath) either lands before the sweep reads last-seen or waits and misses.
    Plain tuples, not model instances: this runs on every locked heartbeat of big groups.
    """
    also = heartbeating_members(member_id)
    member_sql = MEMBER_SQL + f" AND (status IN {in_list(LIVE)} OR member_id IN {in_list(also)})"
    if lock_members and connection.features.has_select_for_update:
        member_sql += " FOR UPDATE"
    return _load(group, member_sql, [group.pk, *LIVE, *also], SLOT_SQL, [group.pk], also)


def load_page(
    group: Group, offset: int, limit: int, *, member_where: str = "", where_params: Sequence[SQLValue] = (),
    shards: bool = True,
) -> tuple[GroupState, list[str], list[str]]:
    """A partial snapshot for one page of describe (issue 26.3): the live members of the page
    (in id order) with every slot they hold or target, and the slots of the page (natural
    order: version, then index; retired versions left out) with their live owners. Returns it
    with the page's member ids and shard ids, in order (those the snapshot holds). A fixed
    number of statements, each bounded by the page size: describe does not read 10,000
    members to show 1,000. `member_where` (" AND …" on the member table, with `where_params`)
    filters the members; `shards=False` reads no page of shards (the admin's member list)."""
    page_members = (
        f"SELECT id FROM {MemberRow._meta.db_table} WHERE group_id = %s AND status IN {in_list(LIVE)}"
        f"{member_where} ORDER BY member_id LIMIT %s OFFSET %s")
    members_params: list[SQLValue] = [group.pk, *LIVE, *where_params, limit, offset]
    page_slots = (
        f"SELECT a.id FROM {ShardAssignment._meta.db_table} a JOIN {Shard._meta.db_table} s ON s.id = a.shard_id"
        f" JOIN {ShardVersion._meta.db_table} v ON v.id = s.version_id WHERE a.group_id = %s AND v.state <> %s"
        " ORDER BY v.version, s.\"index\" LIMIT %s OFFSET %s")  # quoted: INDEX is an SQLite keyword
    slots_params: list[SQLValue] = [group.pk, VersionState.RETIRED, limit if shards else 0, offset]
    with connection.cursor() as cursor:
        cursor.execute(page_members.replace("SELECT id", "SELECT member_id", 1), members_params)
        member_ids = [mid for (mid,) in cursor.fetchall()]
        cursor.execute(page_slots, slots_params)
        slot_pks = [pk for (pk,) in cursor.fetchall()]
    # Each IN is a subquery (or a UNION of index lookups), not a list of a page of parameters.
    member_sql = (
        MEMBER_SQL + f" AND status IN {in_list(LIVE)} AND (id IN ({page_members}) OR id IN"
        f" (SELECT owner_id FROM {ShardAssignment._meta.db_table} WHERE id IN ({page_slots})))")
    member_params: list[SQLValue] = [group.pk, *LIVE, *members_params, *slots_params]
    slot_sql = (
        f"{SLOT_SQL} AND owner_id IN ({page_members}) UNION {SLOT_SQL} AND target_id IN ({page_members})"
        f" UNION {SLOT_SQL} AND id IN ({page_slots})")
    slot_params: list[SQLValue] = [group.pk, *members_params, group.pk, *members_params, group.pk, *slots_params]
    state, loaded = _load(group, member_sql, member_params, slot_sql, slot_params, ())
    by_pk = {pk: sid for sid, pk in loaded.slot_pk.items()}
    # Rows may change between statements (no lock): show what the snapshot holds.
    return (state, [mid for mid in member_ids if mid in state.members],
            [by_pk[pk] for pk in slot_pks if pk in by_pk])


def count_live_members(group: Group, where: str = "", params: Sequence[SQLValue] = ()) -> int:
    """Live members of the group (`where`: " AND …" on the member table, with `params`)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM {MemberRow._meta.db_table} WHERE group_id = %s AND status IN {in_list(LIVE)}"
            f"{where}", [group.pk, *LIVE, *params])
        return int(cursor.fetchone()[0])


def shard_rows(group: Group) -> list[tuple[str, tuple[str, ...], bool, str | None, bool, int, str | None, bool]]:
    """Every live slot of the group as (shard id, parents, sealed, owner, revoking, grant epoch,
    target, drained), owner and target by memberId: one statement, no member rows (the admin's
    shard grid at 16,384 shards without loading 10,000 members; issue 26.3)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT a.shard_id, o.member_id, a.revoking, a.grant_epoch, t.member_id, a.drained_at IS NOT NULL"
            f" FROM {ShardAssignment._meta.db_table} a"
            f" LEFT JOIN {MemberRow._meta.db_table} o ON o.id = a.owner_id"
            f" LEFT JOIN {MemberRow._meta.db_table} t ON t.id = a.target_id WHERE a.group_id = %s", [group.pk])
        rows = cursor.fetchall()
    catalogue = shard_catalogue(group.stream_id, group.stream.metadata_epoch, {row[0] for row in rows})
    out = []
    for shard_pk, owner, revoking, grant_epoch, target, drained in rows:
        info = catalogue.get(shard_pk)
        if info is not None:  # a retired version's leftover row
            out.append((info.shard_id, info.parents, info.sealed, owner, bool(revoking), grant_epoch, target,
                        bool(drained)))
    return out


def _load(
    group: Group, member_sql: str, member_params: Sequence[SQLValue], slot_sql: str,
    slot_params: Sequence[SQLValue], heartbeating: tuple[str, ...],
) -> tuple[GroupState, Loaded]:
    loaded = Loaded(group=group)
    members: dict[str, Member] = {}
    with connection.cursor() as cursor:
        # Raw rows: the ORM's per-row machinery costs more than the query for big groups.
        cursor.execute(member_sql, member_params)
        member_rows = cursor.fetchall()
        pk_member = {row[0]: row[1] for row in member_rows}
        cursor.execute(slot_sql, slot_params)
        slot_rows = cursor.fetchall()
        present = set(pk_member.values())
        reports = _reports(cursor, group, [mid for mid in heartbeating if mid in present])
        name_unloaded(cursor, pk_member, loaded, referenced_members(slot_rows))
    for row in member_rows:
        loaded.member_pk[row[1]] = row[0]
        loaded.member_rows[row[1]] = row
        members[row[1]] = member_from_row(row, reports)
    catalogue = shard_catalogue(
        group.stream_id, group.stream.metadata_epoch, {row[1] for row in slot_rows}
    )
    shards: dict[str, ShardSlot] = {}
    for row in sorted(slot_rows, key=lambda r: r[1]):
        slot = slot_from_row(row, catalogue, pk_member, loaded)
        if slot is not None:
            shards[slot.shard_id] = slot
    state = GroupState(name=group.name, stream=group.stream.name, members=members, shards=shards,
                       **group_settings(group))
    return state, loaded


def group_settings(group: Group) -> dict[str, Any]:
    """The group row's columns as the core's GroupState fields: the one mapping, for a state
    built from rows and for a snapshot brought up to date with a newer row."""
    return dict(
        group_epoch=group.group_epoch,
        assignment_epoch=group.assignment_epoch,
        metadata_epoch=group.metadata_epoch,
        max_members=group.max_members,
        heartbeat_interval_ms=group.heartbeat_interval_ms,
        session_timeout_ms=group.session_timeout_ms,
        rebalance_timeout_ms=group.rebalance_timeout_ms,
        rebalance_window_ms=rebalance_window_ms(),
        rebalanced_at=group.rebalanced_at,
        rebalance_due_at=group.rebalance_due_at,
        rebalance_deferred_at=group.rebalance_deferred_at,
        paused_at=group.paused_at,
        paused_by=group.paused_by,
    )



def rebalance_window_ms() -> int:
    """Join batching's window (`RSC_REBALANCE_WINDOW_MS`, engine.r1b_defer_rebalance)."""
    return int(getattr(settings, "RSC_REBALANCE_WINDOW_MS", 1000))


# The installation's generation as the lock statement and the steady read select it (a missing
# row, a database nobody has used yet, is generation 1: the column's default).
GENERATION_SQL = (
    f"COALESCE((SELECT i.{Installation._meta.get_field('generation').column}"
    f" FROM {Installation._meta.db_table} AS i WHERE i.id = 1), 1)"
)
