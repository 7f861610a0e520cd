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
Drained shards (sealed and read to the end by the group, §6) are left alone.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from redis.exceptions import RedisError, ResponseError

from assignments.models import ShardAssignment
from assignments.store import lock_group
from coordination.model import LIVE_STATUSES
from dataplane.routing import ShardKeys, shard_sort_key
from groups import shardstats
from groups.errors import ServiceError
from groups.models import Event, Group, VersionState

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
    group_name: str, to: str, *, shard: str | None = None, dry_run: bool = False, actor: str,
) -> ResetPlan:
    """Plan and (unless `dry_run`) apply a position reset; refused while members are live."""
    target = resolve_position(to)
    with transaction.atomic():
        group = lock_group(group_name)
        if group is None:
            raise ServiceError(f"group {group_name!r} does not exist")
        live = list(
            group.members.filter(status__in=[s.value for s in LIVE_STATUSES])
            .order_by("member_id").values_list("member_id", flat=True)[:6]
        )
        if live:
            names = ", ".join(live[:5]) + (" and more" if len(live) > 5 else "")
            raise ServiceError(
                f"group {group_name!r} has live members ({names}); stop them (or let them leave) "
                "before resetting its position"
            )
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
                planned.append(PlannedShard(sid, key, current, target, mine is None))
            plan = ResetPlan(group.name, to, tuple(planned), tuple(drained), applied=not dry_run)
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
            detail={"to": to, "lastDeliveredId": target, "shards": len(planned),
                    **({"shard": shard} if shard else {})},
        )
    shardstats.forget(group.name)
    return plan
