"""Read queries about shard assignments, for the admin, describe, the dashboard and the
metrics. Never a write, never a lock: a snapshot of rows committed at read time."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, F, Q

from assignments.models import ShardAssignment
from assignments.rows import load_page, load_state
from coordination.model import (
    LIVE_STATUSES,
    GroupPhase,
    GroupState,
    MemberStatus,
    ShardState,
)
from groups.models import Group, Stream, VersionState
from members.models import Member as MemberRow


def read_group_state(group: Group) -> GroupState:
    """The group as the core sees it (the snapshot it decides on), read without the lock."""
    state, _ = load_state(group)
    return state


@dataclass
class GroupPage:
    """One page of a group as describe shows it (issue 26.3): a partial snapshot holding the
    page's members (with their slots) and the page's shards (with their owners), and the
    counts of the whole group, from aggregates rather than its rows."""

    state: GroupState
    member_ids: list[str]  # the page's live members, in id order
    shard_ids: list[str]  # the page's shards, in natural order
    members_total: int
    shards_total: int
    member_counts: dict[str, int]  # live status -> members
    shard_counts: dict[str, int]  # ShardState -> shards
    phase: GroupPhase


def read_group_page(group: Group, page: int, page_size: int) -> GroupPage:
    """Page `page` (1-based) of `page_size` members and shards, and the group's counts: a fixed
    number of statements, none returning more than a page of rows."""
    state, member_ids, shard_ids = load_page(group, (page - 1) * page_size, page_size)
    live = [s.value for s in LIVE_STATUSES]
    members = MemberRow.objects.filter(group_id=group.pk, status__in=live)
    member_counts = dict.fromkeys(sorted(live), 0)
    member_counts.update(members.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    slots = ShardAssignment.objects.filter(group_id=group.pk).exclude(shard__version__state=VersionState.RETIRED)
    undrained = Q(drained_at__isnull=True)
    shard_counts = slots.aggregate(**{
        ShardState.GRANTED.value: Count("id", filter=undrained & Q(owner__isnull=False, revoking=False)),
        ShardState.REVOKING.value: Count("id", filter=undrained & Q(owner__isnull=False, revoking=True)),
        ShardState.UNOWNED.value: Count("id", filter=undrained & Q(owner__isnull=True)),
        ShardState.DRAINED.value: Count("id", filter=Q(drained_at__isnull=False)),
    })
    return GroupPage(
        state=state, member_ids=member_ids, shard_ids=shard_ids,
        members_total=sum(member_counts.values()), shards_total=sum(shard_counts.values()),
        member_counts=member_counts, shard_counts=shard_counts,
        phase=_phase(group, members, sum(member_counts.values())),
    )


def group_phase_of(group: Group) -> GroupPhase:
    """`engine.group_phase` of the committed rows, from two queries (no snapshot)."""
    members = MemberRow.objects.filter(group_id=group.pk, status__in=[s.value for s in LIVE_STATUSES])
    return _phase(group, members, members.count())


def _phase(group: Group, live: Any, n_live: int) -> GroupPhase:
    """`engine.group_phase` from one query instead of every member: STABLE when every active
    member is STABLE at the assignment epoch."""
    if not n_live:
        return GroupPhase.EMPTY
    if group.assignment_epoch < group.group_epoch:
        return GroupPhase.ASSIGNING
    unsettled = live.exclude(status=MemberStatus.TEMPORARILY_LEFT.value).exclude(
        status=MemberStatus.STABLE.value, member_epoch=group.assignment_epoch)
    return GroupPhase.RECONCILING if unsettled.exists() else GroupPhase.STABLE


def drain_progress(stream: Stream) -> list[dict[str, Any]]:
    """Per group and live version: shards drained and still held (§6.3–6.4)."""
    rows = (
        ShardAssignment.objects.filter(group__stream=stream)
        .exclude(shard__version__state=VersionState.RETIRED)
        .values("group__name", "shard__version__version", "shard__version__state")
        .annotate(
            total=Count("id"),
            drained=Count("id", filter=Q(drained_at__isnull=False)),
            held=Count("id", filter=Q(owner__isnull=False)),
        )
        .order_by("group__name", "shard__version__version")
    )
    return [
        {
            "group": r["group__name"], "version": r["shard__version__version"],
            "state": r["shard__version__state"], "total": r["total"], "drained": r["drained"],
            "held": r["held"],
        }
        for r in rows
    ]


def sealed_drain_by_stream() -> dict[int, tuple[int, int]]:
    """Reshard progress per stream pk: (drained, total) shards of sealed versions, all groups."""
    return {
        r["group__stream_id"]: (r["drained"], r["total"])
        for r in ShardAssignment.objects.filter(shard__version__state=VersionState.SEALED)
        .values("group__stream_id")
        .annotate(total=Count("id"), drained=Count("id", filter=Q(drained_at__isnull=False)))
    }


def shard_counts_by_group() -> dict[str, dict[str, int]]:
    """Live (not retired) shards per group name: n_drained, n_revoking, n_granted, n_unowned,
    and n_pending (in a member's target, not granted to it: pending as the core answers it)."""
    live = ShardAssignment.objects.exclude(shard__version__state=VersionState.RETIRED)
    return {
        r["group__name"]: r
        for r in live.values("group__name").annotate(
            n_drained=Count("id", filter=Q(drained_at__isnull=False)),
            n_revoking=Count("id", filter=Q(drained_at__isnull=True, revoking=True)),
            n_granted=Count("id", filter=Q(drained_at__isnull=True, revoking=False, owner__isnull=False)),
            n_unowned=Count("id", filter=Q(drained_at__isnull=True, owner__isnull=True)),
            # (n_ names: an annotation named like a field would shadow it in FILTER.)
            n_pending=Count("id", filter=Q(target__isnull=False) & (
                Q(owner__isnull=True) | ~Q(owner=F("target")) | Q(revoking=True)
            )),
        )
    }


def undrained_sealed_by_group() -> dict[str, int]:
    """Shards of sealed versions each group (by name) has not drained yet."""
    return dict(
        ShardAssignment.objects.filter(shard__version__state=VersionState.SEALED, drained_at__isnull=True)
        .values("group__name").annotate(n=Count("id")).values_list("group__name", "n")
    )


def held_shards(member_pk: int) -> list[ShardAssignment]:
    """The shards a member row owns, in shard order, with their shard."""
    return list(
        ShardAssignment.objects.filter(owner_id=member_pk).select_related("shard")
        .order_by("shard__version_id", "shard__index")
    )
