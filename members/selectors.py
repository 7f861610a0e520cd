"""Read queries about members, for the admin, the dashboard and the metrics.

Liveness (alive / late / expired / unknown) is classified by `coordination.liveness`, the one
classifier: in Python per row, or in SQL by comparing the last-heartbeat column against the
instants `liveness.cutoffs` gives per group. Never a write, never a lock.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from django.db.models import Count, Q, QuerySet

from coordination.liveness import Liveness, cutoffs, liveness
from coordination.model import LIVE_STATUSES
from groups.models import Group
from members.models import Member

_LIVE = [s.value for s in LIVE_STATUSES]


def status_counts() -> dict[tuple[str, str], int]:
    """(group name, member status) → how many members, tombstones included."""
    return {
        (r["group__name"], r["status"]): r["n"]
        for r in Member.objects.values("group__name", "status").annotate(n=Count("id"))
    }


def liveness_by_group(now: datetime) -> dict[int, Counter[Liveness]]:
    """Live members of each group (by pk) counted by liveness at `now`."""
    rows = Member.objects.filter(status__in=_LIVE).values_list(
        "group_id", "last_heartbeat_at", "group__heartbeat_interval_ms", "group__session_timeout_ms"
    )
    counts: dict[int, Counter[Liveness]] = {}
    for group_id, last, interval_ms, session_ms in rows:
        _, state = liveness(last, now, interval_ms, session_ms)
        counts.setdefault(group_id, Counter())[state] += 1
    return counts


def filter_by_liveness(members: QuerySet[Member], state: Liveness, now: datetime) -> QuerySet[Member]:
    """The live members among `members` that the classifier puts in `state` at `now`.

    One condition per group, on that group's cutoffs (a few groups, not members, per query)."""
    if state == Liveness.UNKNOWN:
        return members.filter(status__in=_LIVE, last_heartbeat_at__isnull=True)
    match = Q(pk__in=[])  # no group: nothing
    for group_id, interval_ms, session_ms in Group.objects.values_list(
        "id", "heartbeat_interval_ms", "session_timeout_ms"
    ):
        c = cutoffs(now, interval_ms, session_ms)
        if state == Liveness.EXPIRED:
            heard = Q(last_heartbeat_at__lt=c.expired_before)
        elif state == Liveness.LATE:
            heard = Q(last_heartbeat_at__gte=c.expired_before, last_heartbeat_at__lt=c.late_before)
        else:
            heard = Q(last_heartbeat_at__gte=c.expired_before) & Q(last_heartbeat_at__gte=c.late_before)
        match |= Q(group_id=group_id) & heard
    return members.filter(status__in=_LIVE).filter(match)


def with_shard_counts(members: QuerySet[Member]) -> QuerySet[Member]:
    """Each member annotated with `held` (shards it owns) and `revoking` (of those, revoking)."""
    return members.annotate(
        held=Count("owned_shards", distinct=True),
        revoking=Count("owned_shards", filter=Q(owned_shards__revoking=True), distinct=True),
    )


def library_versions(group: Group, member_ids: Sequence[str] | None = None) -> dict[str, str]:
    """memberId -> the client library and version its join named (issue 25.7), live members
    (only these, when given: one describe page)."""
    rows = Member.objects.filter(group=group, status__in=[s.value for s in LIVE_STATUSES])
    if member_ids is not None:
        rows = rows.filter(member_id__in=list(member_ids))
    return dict(rows.values_list("member_id", "library_version"))

