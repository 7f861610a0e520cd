"""Load a group's protocol state from the database and persist what the core changed.

The only code that turns rows into `coordination.model` objects and back. Callers hold the
group's row lock (`lock_group`) for the whole load → core → save sequence.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Q

from assignments.models import ShardAssignment
from coordination.model import LIVE_STATUSES, GroupState, Member, MemberStatus, ShardSlot
from groups.models import Event, Group, VersionState
from members.models import Member as MemberRow

_LIVE = [s.value for s in LIVE_STATUSES]


@dataclass
class Loaded:
    """Row ids behind the loaded state, so saving touches rows by primary key."""

    group: Group
    member_pk: dict[str, int] = field(default_factory=dict)
    slot_pk: dict[str, int] = field(default_factory=dict)
    drained_at: dict[str, datetime] = field(default_factory=dict)


def lock_group(name: str) -> Group | None:
    """Take the group's row lock (held until the surrounding transaction ends)."""
    return Group.objects.select_for_update().select_related("stream").filter(name=name).first()


def load_state(
    group: Group, also_members: tuple[str, ...] = (), *, lock_members: bool = False
) -> tuple[GroupState, Loaded]:
    """Load live members (plus `also_members`' rows, e.g. a tombstone) and the group's slots.

    `lock_members` row-locks the members too: sweeps use it so a concurrent lock-free steady
    heartbeat (fastpath) either lands before the sweep reads last-seen or waits and misses.
    """
    loaded = Loaded(group=group)
    members: dict[str, Member] = {}
    rows = MemberRow.objects.filter(group=group).filter(
        Q(status__in=_LIVE) | Q(member_id__in=also_members)
    )
    if lock_members:
        rows = rows.select_for_update()
    for row in rows:
        loaded.member_pk[row.member_id] = row.pk
        members[row.member_id] = Member(
            member_id=row.member_id,
            status=MemberStatus(row.status),
            member_epoch=row.member_epoch,
            previous_member_epoch=row.previous_member_epoch,
            client_id=row.client_id,
            rebalance_timeout_ms=row.rebalance_timeout_ms,
            joined_at=row.joined_at,
            last_heartbeat_at=row.last_heartbeat_at,
            revocation_deadline=row.revocation_deadline,
            last_reported_owned=tuple(row.last_reported_owned or ()),
            fenced_reason=row.fenced_reason,
            fenced_by=row.fenced_by,
        )
    pk_member = {pk: mid for mid, pk in loaded.member_pk.items()}
    shards: dict[str, ShardSlot] = {}
    slot_rows = (
        ShardAssignment.objects.filter(group=group)
        .exclude(shard__version__state=VersionState.RETIRED)
        .order_by("shard__version__version", "shard__index")
        .values_list(
            "id", "shard__shard_id", "shard__parents", "shard__version__state",
            "owner_id", "revoking", "grant_epoch", "target_id", "drained_at",
        )
    )
    for pk, shard_id, parents, vstate, owner, revoking, grant_epoch, target, drained_at in slot_rows:
        loaded.slot_pk[shard_id] = pk
        if drained_at is not None:
            loaded.drained_at[shard_id] = drained_at
        shards[shard_id] = ShardSlot(
            shard_id=shard_id,
            parents=tuple(parents or ()),
            sealed=vstate == VersionState.SEALED,
            owner=pk_member.get(owner) if owner else None,
            revoking=revoking,
            grant_epoch=grant_epoch,
            target=pk_member.get(target) if target else None,
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
    for mid in sorted(changes.members):
        m = state.members[mid]
        values = dict(
            status=m.status.value,
            member_epoch=m.member_epoch,
            previous_member_epoch=m.previous_member_epoch,
            client_id=m.client_id,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
            joined_at=m.joined_at,
            last_heartbeat_at=m.last_heartbeat_at,
            revocation_deadline=m.revocation_deadline,
            last_reported_owned=list(m.last_reported_owned),
            fenced_reason=m.fenced_reason,
            fenced_by=m.fenced_by,
        )
        pk = loaded.member_pk.get(mid)
        if pk is None:
            # A tombstone not loaded (or a new member): upsert by the natural key.
            row, _ = MemberRow.objects.update_or_create(group=group, member_id=mid, defaults=values)
            loaded.member_pk[mid] = row.pk
        else:
            MemberRow.objects.filter(pk=pk).update(**values)
    if changes.shards:
        rows = []
        for shard_id in changes.shards:
            slot = state.shards[shard_id]
            rows.append(
                ShardAssignment(
                    pk=loaded.slot_pk[shard_id],
                    owner_id=loaded.member_pk[slot.owner] if slot.owner else None,
                    revoking=slot.revoking,
                    grant_epoch=slot.grant_epoch,
                    target_id=loaded.member_pk[slot.target] if slot.target else None,
                    drained_at=loaded.drained_at.setdefault(shard_id, now) if slot.drained else None,
                )
            )
        ShardAssignment.objects.bulk_update(
            rows, ["owner_id", "revoking", "grant_epoch", "target_id", "drained_at"], batch_size=1000
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
