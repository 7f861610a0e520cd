"""Position reset: move a group's last-delivered ID on its live shards (`--reset-offsets`).

The only writer of a consumer group's position besides the members themselves. It runs
`XGROUP SETID` (or `XGROUP CREATE ... MKSTREAM` where the group has no consumer group on the
shard yet) and never reads, ACKs or deletes entries (§8). It is refused while the group has
live members: a member reading a shard while its position moves would skip or repeat
entries behind its back. The group's row lock is held throughout, so no member can join
(R1 takes the same lock) until the reset is done; the next member to be granted a shard
reads from the new position (the data plane's XGROUP CREATE keeps an existing group).

Positions (`to`):
  earliest   every entry still in the shard is delivered again ("0")
  latest     only entries appended after the reset ("$", resolved by Redis per shard)
  <ID>       an entry ID (`1700000000000-0` or `1700000000000`): delivery resumes after it
  <ISO time> an ISO-8601 date-time: delivery resumes with the first entry at or after it
  shift-by N each shard's last-delivered ID moves N entries (negative: the last N are delivered
             again; positive: the next N are skipped), within the shard's entries
Drained shards (sealed and read to the end by the group, §6) are left alone. A dry run shows
the plan while members are live; applying it is refused then.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from django.utils import timezone
from redis.exceptions import RedisError, ResponseError

from assignments.models import ShardAssignment
from assignments.rows import lock_group
from coordination.model import LIVE_STATUSES, MemberStatus
from dataplane.routing import ShardKeys, shard_sort_key
from groups import shardstats
from groups.errors import ServiceError
from groups.models import Event, Group, VersionState
from groups.services import temporarily_left_note

_ID_RE = re.compile(r"^(\d{1,20})(?:-(\d{1,20}))?$")
_MAX_SEQ = 2**64 - 1


def resolve_position(to: str) -> str:
    """The last-delivered ID for `to` (earliest | latest | ID | ISO date-time), or ServiceError."""
    value = (to or "").strip()
    if value == "earliest":
        return "0-0"
    if value == "latest":
        return "$"
    m = _ID_RE.match(value)
    if m:
        ms, seq = int(m.group(1)), int(m.group(2) or 0)
        if ms > _MAX_SEQ or seq > _MAX_SEQ:
            raise ServiceError(f"to: entry ID {value!r} is out of range")
        return f"{ms}-{seq}"
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ServiceError(
            f"to: {value!r} is not earliest, latest, an entry ID (e.g. 1700000000000-0) or an ISO date-time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # the coordinator's clock and the admin speak UTC
    ms = int(when.timestamp() * 1000)
    # The greatest ID before `ms`: the first entry at or after the time is delivered next.
    return "0-0" if ms <= 0 else f"{ms - 1}-{_MAX_SEQ}"


@dataclass(frozen=True)
class PlannedShard:
    shard_id: str
    stream_key: str
    current: str | None  # the group's last-delivered ID now; None: no consumer group yet
    target: str  # the new last-delivered ID ("$": the shard's last entry)
    create: bool  # XGROUP CREATE ... MKSTREAM instead of XGROUP SETID

    def describe(self) -> str:
        verb = "create consumer group at" if self.create else f"{self.current} →"
        return f"{self.shard_id}: {verb} {self.target}"


@dataclass(frozen=True)
class ResetPlan:
    group: str
    to: str
    shards: tuple[PlannedShard, ...]
    skipped_drained: tuple[str, ...]
    applied: bool

    def lines(self) -> list[str]:
        head = "reset" if self.applied else "would reset"
        out = [f"{head} group {self.group} to {self.to} on {len(self.shards)} shard(s)"]
        out += [f"  {s.describe()}" for s in self.shards]
        if self.skipped_drained:
            out.append(f"  skipped (drained): {', '.join(self.skipped_drained)}")
        return out


def _refuse_while_live(group: Group) -> None:
    """Members reading a shard while its position moves would skip or repeat entries behind
    its back. A static member that left temporarily (§9) still holds its shards: it is named
    with its instance id, when it expires, and how to remove it now."""
    live = list(
        group.members.filter(status__in=[s.value for s in LIVE_STATUSES])
        .order_by("member_id").values_list("member_id", "status", "instance_id", "last_heartbeat_at")[:50]
    )
    if not live:
        return
    now = timezone.now()
    away = [(mid, iid, last) for mid, status, iid, last in live if status == MemberStatus.TEMPORARILY_LEFT]
    running = [mid for mid, status, _iid, _last in live if status != MemberStatus.TEMPORARILY_LEFT]
    parts = []
    if running:
        names = ", ".join(running[:5]) + (" and more" if len(running) > 5 else "")
        parts.append(f"live members ({names}): stop them (or let them leave)")
    if away:
        parts.append(temporarily_left_note(group, away, now))
    raise ServiceError(
        f"group {group.name!r} has " + "; and ".join(parts) + "; then reset its position"
        " (--dry-run shows the plan meanwhile)"
    )


def _shifted(client: object, key: str, current: str | None, shift_by: int) -> str:
    """The last-delivered ID `shift_by` entries from `current` (None: the group has not read
    the shard: from its start). Bounded by the shard's first and last entries."""
    base = current or "0-0"
    if shift_by < 0:
        # Entries at or before `base`, newest first: the (|n|+1)-th is the new last-delivered
        # one, so |n| entries are delivered again; fewer than that: from the start.
        back = client.xrevrange(key, max=base, min="-", count=-shift_by + 1)  # type: ignore[attr-defined]
        return _id(back[-shift_by][0]) if len(back) > -shift_by else "0-0"
    if shift_by == 0:
        return base
    ahead = client.xrange(key, min=f"({base}", max="+", count=shift_by)  # type: ignore[attr-defined]
    return _id(ahead[-1][0]) if ahead else base


def _id(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _shards(group: Group, only: str | None) -> tuple[list[str], list[str]]:
    rows = (
        ShardAssignment.objects.filter(group=group)
        .exclude(shard__version__state=VersionState.RETIRED)
        .values_list("shard__shard_id", "drained_at")
    )
    live = sorted(((sid, drained) for sid, drained in rows), key=lambda r: shard_sort_key(r[0]))
    if only is not None:
        live = [r for r in live if r[0] == only]
        if not live:
            raise ServiceError(f"shard: {only!r} is not a live shard of group {group.name!r}")
    return [sid for sid, drained in live if drained is None], [sid for sid, drained in live if drained is not None]


def reset_position(
    group_name: str, to: str | None = None, *, shift_by: int | None = None, shard: str | None = None,
    dry_run: bool = False, actor: str,
) -> ResetPlan:
    """Plan and (unless `dry_run`) apply a position reset: to a position (`to`), or each shard's
    last-delivered ID moved by `shift_by` entries (negative: deliver that many again; positive:
    skip that many). Applying it is refused while members are live; a dry run shows the plan
    whatever the members do."""
    if (to is None) == (shift_by is None):
        raise ServiceError("give exactly one of to (a position) and shift_by (a number of entries)")
    target = resolve_position(to) if to is not None else ""
    described = to if to is not None else f"shift-by {shift_by:+d}"
    with transaction.atomic():
        group = lock_group(group_name)
        if group is None:
            raise ServiceError(f"group {group_name!r} does not exist")
        if not dry_run:
            _refuse_while_live(group)
        shard_ids, drained = _shards(group, shard)
        prefix = group.stream.key_prefix
        keys = [ShardKeys(s, prefix).stream for s in shard_ids]
        client = shardstats.stream_client()
        try:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.xinfo_groups(key)
            infos = pipe.execute(raise_on_error=False)
            planned = []
            for sid, key, info in zip(shard_ids, keys, infos, strict=True):
                if isinstance(info, Exception) and not isinstance(info, ResponseError):
                    raise info
                mine = shardstats.group_entry(info, group.name)
                current = None if mine is None else str(mine.get("last-delivered-id"))
                moved = target if shift_by is None else _shifted(client, key, current, shift_by)
                planned.append(PlannedShard(sid, key, current, moved, mine is None))
            plan = ResetPlan(group.name, described, tuple(planned), tuple(drained), applied=not dry_run)
            if dry_run:
                return plan
            pipe = client.pipeline(transaction=False)
            for p in planned:
                if p.create:
                    pipe.xgroup_create(p.stream_key, group.name, id=p.target, mkstream=True)
                else:
                    pipe.xgroup_setid(p.stream_key, group.name, id=p.target)
            for p, result in zip(planned, pipe.execute(raise_on_error=False), strict=True):
                if isinstance(result, Exception):
                    if "BUSYGROUP" not in str(result):
                        raise result
                    # Created since the plan was read (a stray reader): move it all the same.
                    client.xgroup_setid(p.stream_key, group.name, id=p.target)
        except RedisError as exc:
            raise ServiceError(
                f"Redis refused the reset ({type(exc).__name__}: {exc}); shards before the failing one "
                "may have moved: run it again"
            ) from exc
        Event.objects.create(
            kind="position_reset", group=group, stream_id=group.stream_id, actor=actor,
            detail={"to": described, "lastDeliveredId": target or None, "shards": len(planned),
                    **({"shard": shard} if shard else {})},
        )
    shardstats.forget(group.name)
    return plan
