"""Load a group's protocol state from the database and persist what the core changed.

The only code that turns rows into `coordination.model` objects and back. Callers hold the
group's row lock (`lock_group`) for the whole load → core → save sequence.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import connection

from assignments.models import ShardAssignment
from coordination.model import LIVE_STATUSES, GroupState, Member, MemberStatus, ShardSlot
from groups.models import Event, Group, Shard, VersionState
from members.models import Member as MemberRow

_LIVE = [s.value for s in LIVE_STATUSES]
event_log = logging.getLogger("coordinator.events")


@dataclass
class Loaded:
    """Row ids behind the loaded state, so saving touches rows by primary key."""

    group: Group
    member_pk: dict[str, int] = field(default_factory=dict)
    slot_pk: dict[str, int] = field(default_factory=dict)
    drained_at: dict[str, datetime] = field(default_factory=dict)


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


# The static part of a stream's shards, per process, by (stream, metadataEpoch): every change
# to versions (new version, seal, retire) raises the stream's metadataEpoch.
_catalogue: dict[tuple[int, int], dict[int, _ShardInfo]] = {}


def _shard_catalogue(stream_id: int, metadata_epoch: int, need: set[int]) -> dict[int, _ShardInfo]:
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


# In a partial snapshot, a slot owned or targeted by a member that was not loaded carries
# this stand-in name, which maps back to the same row id when the slot is saved.
_UNLOADED = "\x00member-pk:"


def _member_name(pk_member: dict[int, str], pk: int | None) -> str | None:
    if pk is None:
        return None
    return pk_member.get(pk) or f"{_UNLOADED}{pk}"


def _member_pk(loaded: Loaded, name: str | None) -> int | None:
    if name is None:
        return None
    if name.startswith(_UNLOADED):
        return int(name[len(_UNLOADED):])
    return loaded.member_pk[name]

def _in(values: tuple[str, ...] | list[str]) -> str:
    """A portable IN list (SQLite has no = ANY); (NULL) matches nothing."""
    return "(" + ", ".join(["%s"] * len(values)) + ")" if values else "(NULL)"


def _aware(value: datetime | None) -> datetime | None:
    # Raw SQLite rows carry naive UTC datetimes (the ORM would attach the zone).
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


_MEMBER_COLUMNS = (
    "id", "member_id", "status", "member_epoch", "previous_member_epoch", "client_id",
    "rebalance_timeout_ms", "last_heartbeat_at", "revocation_deadline",
    "fenced_reason", "fenced_by", "instance_id",
)


def load_state(
    group: Group,
    also_members: tuple[str, ...] = (),
    *,
    lock_members: bool = False,
    only_member: str | None = None,
    claimed: tuple[str, ...] = (),
) -> tuple[GroupState, Loaded]:
    """Load live members (plus `also_members`' rows, e.g. a tombstone) and the group's slots.

    `lock_members` row-locks the members too: sweeps use it so a concurrent lock-free steady
    heartbeat (fastpath) either lands before the sweep reads last-seen or waits and misses.
    `only_member` loads a partial snapshot: that member and the slots it holds or targets,
    plus the shards it `claimed`, enough for R3–R7 of its heartbeat; the core refuses to
    recompute the target on it.
    Plain tuples, not model instances: this runs on every locked heartbeat of big groups.
    """
    loaded = Loaded(group=group)
    members: dict[str, Member] = {}
    also_members = tuple(also_members) + ((only_member,) if only_member else ())
    member_sql = f"SELECT {', '.join(_MEMBER_COLUMNS)} FROM {MemberRow._meta.db_table} WHERE group_id = %s"
    if only_member is not None:
        member_sql += " AND member_id = %s"
        member_params: list[object] = [group.pk, only_member]
    else:
        member_sql += f" AND (status IN {_in(_LIVE)} OR member_id IN {_in(also_members)})"
        member_params = [group.pk, *_LIVE, *also_members]
    if lock_members and connection.features.has_select_for_update:
        member_sql += " FOR UPDATE"
    slot_sql = (
        "SELECT id, shard_id, owner_id, revoking, grant_epoch, target_id, drained_at"
        f" FROM {ShardAssignment._meta.db_table} WHERE group_id = %s"
    )
    with connection.cursor() as cursor:
        # Raw rows: the ORM's per-row machinery costs more than the query for big groups.
        cursor.execute(member_sql, member_params)
        member_rows = cursor.fetchall()
        pk_member = {row[0]: row[1] for row in member_rows}
        if only_member is not None:
            pk = next(iter(pk_member), None)
            slot_sql += (
                " AND (owner_id = %s OR target_id = %s OR shard_id IN"
                f" (SELECT id FROM {Shard._meta.db_table} WHERE shard_id IN {_in(claimed)}))"
            )
            cursor.execute(slot_sql, [group.pk, pk, pk, *claimed])
        else:
            cursor.execute(slot_sql, [group.pk])
        slot_rows = cursor.fetchall()
        want_report = [m for m in also_members if m in pk_member.values()]
        reports: dict[str, list[str]] = {}
        if want_report:
            cursor.execute(
                f"SELECT member_id, last_reported_owned FROM {MemberRow._meta.db_table}"
                f" WHERE group_id = %s AND member_id IN {_in(want_report)}",
                [group.pk, *want_report],
            )
            reports = {mid: owned if isinstance(owned, list) else json.loads(owned or "[]")
                       for mid, owned in cursor.fetchall()}
    for (pk, mid, status, epoch, prev, client_id, rto, last_hb, deadline_at,
         reason, by, instance_id) in member_rows:
        loaded.member_pk[mid] = pk
        members[mid] = Member(
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
    catalogue = _shard_catalogue(
        group.stream_id, group.stream.metadata_epoch, {row[1] for row in slot_rows}
    )
    shards: dict[str, ShardSlot] = {}
    for pk, shard_pk, owner, revoking, grant_epoch, target, drained_at in sorted(
        slot_rows, key=lambda r: r[1]
    ):
        info = catalogue.get(shard_pk)
        if info is None:  # a retired version's leftover row
            continue
        loaded.slot_pk[info.shard_id] = pk
        if drained_at is not None:
            loaded.drained_at[info.shard_id] = _aware(drained_at)
        shards[info.shard_id] = ShardSlot(
            shard_id=info.shard_id,
            parents=info.parents,
            sealed=info.sealed,
            owner=_member_name(pk_member, owner),
            revoking=revoking,
            grant_epoch=grant_epoch,
            target=_member_name(pk_member, target),
            drained=drained_at is not None,
        )
    state = GroupState(
        name=group.name,
        stream=group.stream.name,
        group_epoch=group.group_epoch,
        assignment_epoch=group.assignment_epoch,
        metadata_epoch=group.metadata_epoch,
        max_members=group.max_members,
        heartbeat_interval_ms=group.heartbeat_interval_ms,
        session_timeout_ms=group.session_timeout_ms,
        rebalance_timeout_ms=group.rebalance_timeout_ms,
        members=members,
        shards=shards,
        partial=only_member is not None,
    )
    return state, loaded


def save_state(state: GroupState, loaded: Loaded, now: datetime, actor: str = "") -> None:
    """Write the dirty group, member and slot rows and the events, in that order."""
    changes = state.changes
    group = loaded.group
    if changes.group:
        group.group_epoch = state.group_epoch
        group.assignment_epoch = state.assignment_epoch
        Group.objects.filter(pk=group.pk).update(
            group_epoch=state.group_epoch, assignment_epoch=state.assignment_epoch
        )
    # Removed members first: a replacement (§9 R1s) takes over the old one's instanceId, which
    # the unique constraint allows only once the old row is no longer live.
    for mid in sorted(changes.members, key=lambda mid: (state.members[mid].live, mid)):
        m = state.members[mid]
        values = dict(
            status=m.status.value,
            member_epoch=m.member_epoch,
            previous_member_epoch=m.previous_member_epoch,
            client_id=m.client_id,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
            last_heartbeat_at=m.last_heartbeat_at,
            revocation_deadline=m.revocation_deadline,
            fenced_reason=m.fenced_reason,
            fenced_by=m.fenced_by,
            instance_id=m.instance_id,
        )
        if m.joined_at is not None:
            values["joined_at"] = m.joined_at
        if m.last_reported_owned is not None:  # None: not loaded, leave the column alone
            values["last_reported_owned"] = list(m.last_reported_owned)
        pk = loaded.member_pk.get(mid)
        if pk is None:
            # A tombstone not loaded (or a new member): upsert by the natural key.
            row, _ = MemberRow.objects.update_or_create(group=group, member_id=mid, defaults=values)
            loaded.member_pk[mid] = row.pk
        else:
            MemberRow.objects.filter(pk=pk).update(**values)
    if changes.shards:
        # Plain UPDATEs sent as one pipelined batch: Django's bulk_update builds a CASE per
        # field and row, which cost more than the rest of a join for big groups.
        rows = []
        for shard_id in sorted(changes.shards):
            slot = state.shards[shard_id]
            drained_at = loaded.drained_at.setdefault(shard_id, now) if slot.drained else None
            rows.append((
                _member_pk(loaded, slot.owner), slot.revoking, slot.grant_epoch,
                _member_pk(loaded, slot.target),
                connection.ops.adapt_datetimefield_value(drained_at),  # SQLite: naive UTC text
                loaded.slot_pk[shard_id],
            ))
        with connection.cursor() as cursor:
            cursor.executemany(
                f"UPDATE {ShardAssignment._meta.db_table} SET owner_id = %s, revoking = %s,"
                " grant_epoch = %s, target_id = %s, drained_at = %s WHERE id = %s",
                rows,
            )
    if changes.events:
        Event.objects.bulk_create(
            Event(
                kind=e.kind,
                group=group,
                stream_id=group.stream_id,
                member_id=e.member_id,
                group_epoch=e.group_epoch,
                member_epoch=e.member_epoch,
                actor=str(e.detail.get("actor", actor)),
                detail=e.detail,
            )
            for e in changes.events
        )
        for e in changes.events:  # one log line per event row (JSON with LOG_FORMAT=json)
            event_log.info(
                "%s group=%s member=%s groupEpoch=%s %s", e.kind, state.name, e.member_id or "-",
                e.group_epoch, " ".join(f"{k}={v}" for k, v in e.detail.items()),
                extra={"event": e.kind, "group": state.name, "stream": state.stream, "memberId": e.member_id,
                       "memberEpoch": e.member_epoch, "groupEpoch": e.group_epoch,
                       "assignmentEpoch": e.detail.get("assignmentEpoch")},
            )
