"""Retention (issue 8.5): old member tombstones and old events are deleted, in batches.

Tombstones (LEFT, EXPIRED, FENCED member rows) exist so a removed process's next heartbeat
is told why (R8, L1). Without the row the core answers a heartbeat with memberEpoch > 0 from
that memberId UNKNOWN_MEMBER_ID ("never joined"), which is what LEFT and EXPIRED already get,
and the member does the same either way (C4: stop, clear, rejoin with the same memberId). A
FENCED row's FENCED_MEMBER_EPOCH turns into UNKNOWN_MEMBER_ID once it is gone, so a tombstone
is only deleted once its member has been silent longer than both the retention age and the
group's session timeout: had it still been a member, L1 would have expired it by then and the
protocol's answer would be UNKNOWN_MEMBER_ID too. A rejoin (memberEpoch 0) needs no row.

Each batch runs under the group's row lock, the lock every locked heartbeat holds from load
to save, so a heartbeat that loaded a tombstone (to rejoin it) never saves over a row deleted
underneath it; the DELETE re-checks status and age (compare-and-set) and skips any row a
shard still points at. Events are history only: deleted by age, in batches, without locks.

Count caps per group (issue 27.9: one API key made 30,284 joins and leaves in 5 minutes, about
8.7 M tombstones and 17 M events a day at the default ages): beyond MAX_TOMBSTONES_PER_GROUP
tombstones, the oldest (least recently heard) go first, whatever the retention age, but never
one heard within the group's session timeout, for the reason above; beyond
MAX_EVENTS_PER_GROUP events, the oldest go first. Both through the same locked,
compare-and-set deletes as the age rule. A stream's own events (no group: reshard steps, stream
key events, group deletions) are capped the same way at MAX_EVENTS_PER_STREAM per stream, and
events of neither a group nor a stream at that cap too (issue 27.10's remainder of 27.9).
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, F, OuterRef, Q
from django.utils import timezone

from assignments.models import ShardAssignment
from assignments.rows import lock_group
from assignments.writer import delete_members
from coordination.model import MemberStatus
from groups.models import Event, Group
from members.models import Member

TOMBSTONES = [MemberStatus.LEFT.value, MemberStatus.EXPIRED.value, MemberStatus.FENCED.value]
BATCH = 500


def apply_retention(
    now: datetime | None = None,
    *,
    tombstone_age: timedelta | None = None,
    event_age: timedelta | None = None,
    batch: int = BATCH,
    max_tombstones: int | None = None,
    max_events: int | None = None,
    max_stream_events: int | None = None,
) -> dict[str, int]:
    """One pass. Ages and caps default to the settings; a zero age or cap (here or there)
    keeps everything as far as that rule goes. The age rule runs first, then the caps."""
    now = now or timezone.now()
    if tombstone_age is None:
        seconds = int(getattr(settings, "MEMBER_TOMBSTONE_RETENTION_SECONDS", 86_400))
        tombstone_age = timedelta(seconds=seconds) if seconds > 0 else None
    if event_age is None:
        days = int(getattr(settings, "EVENT_RETENTION_DAYS", 30))
        event_age = timedelta(days=days) if days > 0 else None
    if max_tombstones is None:
        max_tombstones = int(getattr(settings, "MAX_TOMBSTONES_PER_GROUP", 10_000))
    if max_events is None:
        max_events = int(getattr(settings, "MAX_EVENTS_PER_GROUP", 100_000))
    if max_stream_events is None:
        max_stream_events = int(getattr(settings, "MAX_EVENTS_PER_STREAM", 100_000))
    tombstones = delete_old_tombstones(now, tombstone_age, batch) if tombstone_age else 0
    events = delete_old_events(now - event_age, batch) if event_age else 0
    if max_tombstones > 0:
        tombstones += delete_tombstones_over_cap(now, max_tombstones, batch)
    if max_events > 0:
        events += delete_events_over_cap(max_events, batch)
    if max_stream_events > 0:
        events += delete_stream_events_over_cap(max_stream_events, batch)
    return {"tombstones": tombstones, "events": events}


def _old_tombstones(cutoff: datetime) -> Q:
    return Q(status__in=TOMBSTONES) & (Q(last_heartbeat_at__lt=cutoff) | Q(last_heartbeat_at__isnull=True))


def delete_old_tombstones(now: datetime, age: timedelta, batch: int = BATCH) -> int:
    # A cheap hint first, so a pass locks only groups that have something to delete.
    group_ids = set(Member.objects.filter(_old_tombstones(now - age)).values_list("group_id", flat=True))
    deleted = 0
    for name, timeout_ms in Group.objects.filter(id__in=group_ids).values_list("name", "session_timeout_ms"):
        cutoff = now - max(age, timedelta(milliseconds=timeout_ms))
        while True:
            n = _delete_batch(name, cutoff, batch)
            deleted += n
            if n < batch:
                break
    return deleted


def _delete_batch(group_name: str, cutoff: datetime, batch: int) -> int:
    referenced = ShardAssignment.objects.filter(Q(owner=OuterRef("pk")) | Q(target=OuterRef("pk")))
    with transaction.atomic():
        group = lock_group(group_name)  # released at the end of this batch: heartbeats wait one batch
        if group is None:
            return 0
        ids = list(
            Member.objects.filter(group=group)
            .filter(_old_tombstones(cutoff))
            .exclude(Exists(referenced))
            .order_by("id")
            .values_list("id", flat=True)[:batch]
        )
        # Through the store: a process's snapshot may still hold one of them as live (its
        # sweep ran elsewhere), and must reload rather than assign shards to a deleted row.
        delete_members(group, ids, _old_tombstones(cutoff))
        return len(ids)


def delete_old_events(cutoff: datetime, batch: int = BATCH) -> int:
    deleted = 0
    while True:
        ids = list(Event.objects.filter(created_at__lt=cutoff).order_by("id").values_list("id", flat=True)[:batch])
        if ids:
            Event.objects.filter(id__in=ids).delete()
        deleted += len(ids)
        if len(ids) < batch:
            return deleted


def delete_tombstones_over_cap(now: datetime, cap: int, batch: int = BATCH) -> int:
    """Per group over `cap` tombstones: the least recently heard go until `cap` are left,
    except those heard within the group's session timeout and those a shard still names."""
    over = (
        Member.objects.filter(status__in=TOMBSTONES).values("group_id")
        .annotate(n=Count("id")).filter(n__gt=cap).values_list("group_id", flat=True)
    )
    deleted = 0
    for name, timeout_ms in Group.objects.filter(id__in=list(over)).values_list("name", "session_timeout_ms"):
        cutoff = now - timedelta(milliseconds=timeout_ms)
        while True:
            n = _delete_oldest_batch(name, cutoff, cap, batch)
            deleted += n
            if n < batch:
                break
    return deleted


def _delete_oldest_batch(group_name: str, cutoff: datetime, cap: int, batch: int) -> int:
    referenced = ShardAssignment.objects.filter(Q(owner=OuterRef("pk")) | Q(target=OuterRef("pk")))
    with transaction.atomic():
        group = lock_group(group_name)  # as _delete_batch: heartbeats wait one batch
        if group is None:
            return 0
        # Counted under the lock: a tombstone rejoined since the hint is live again.
        excess = Member.objects.filter(group=group, status__in=TOMBSTONES).count() - cap
        if excess <= 0:
            return 0
        ids = list(
            Member.objects.filter(group=group)
            .filter(_old_tombstones(cutoff))
            .exclude(Exists(referenced))
            .order_by(F("last_heartbeat_at").asc(nulls_first=True), "id")
            .values_list("id", flat=True)[:min(batch, excess)]
        )
        delete_members(group, ids, _old_tombstones(cutoff))
        return len(ids)


def delete_events_over_cap(cap: int, batch: int = BATCH) -> int:
    """Per group over `cap` events: the oldest go until `cap` are left (ids rise with time).
    A stream's own events: delete_stream_events_over_cap."""
    over = (
        Event.objects.filter(group__isnull=False).values("group_id")
        .annotate(n=Count("id")).filter(n__gt=cap).values_list("group_id", flat=True)
    )
    return sum(_delete_oldest_events(Q(group_id=group_id), cap, batch) for group_id in list(over))


def delete_stream_events_over_cap(cap: int, batch: int = BATCH) -> int:
    """Per stream over `cap` events of no group: the oldest go until `cap` are left. Events of
    neither a group nor a stream count as one more such stream."""
    over = (
        Event.objects.filter(group__isnull=True).values("stream_id")
        .annotate(n=Count("id")).filter(n__gt=cap).values_list("stream_id", flat=True)
    )
    deleted = 0
    for stream_id in list(over):
        own = Q(stream_id=stream_id) if stream_id is not None else Q(stream__isnull=True)
        deleted += _delete_oldest_events(Q(group__isnull=True) & own, cap, batch)
    return deleted


def _delete_oldest_events(which: Q, cap: int, batch: int) -> int:
    """The events matching `which` older than its `cap` newest, in batches (history only: no lock)."""
    newest_kept = list(Event.objects.filter(which).order_by("-id").values_list("id", flat=True)[cap - 1:cap])
    if not newest_kept:
        return 0
    deleted = 0
    while True:
        ids = list(Event.objects.filter(which, id__lt=newest_kept[0])
                   .order_by("id").values_list("id", flat=True)[:batch])
        if ids:
            Event.objects.filter(id__in=ids).delete()
        deleted += len(ids)
        if len(ids) < batch:
            return deleted
