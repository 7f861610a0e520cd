"""Read queries about shard assignments, for the admin, describe, the dashboard and the
metrics. Never a write, never a lock: a snapshot of rows committed at read time."""
from __future__ import annotations

from typing import Any

from django.db.models import Count, F, Q

from assignments.models import ShardAssignment
from assignments.rows import load_state
from coordination.model import GroupState
from groups.models import Group, Stream, VersionState


def read_group_state(group: Group) -> GroupState:
    """The group as the core sees it (the snapshot it decides on), read without the lock."""
    state, _ = load_state(group)
    return state


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
