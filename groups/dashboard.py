"""The admin index dashboard: streams with state and reshard progress; groups with live and
late members, total lag, pending and DLQ; when each sweep last ran. Aggregate queries plus the
cached shard statistics (≤ 2 s old), so its cost does not grow with members × shards."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Q

from assignments.models import ShardAssignment
from coordination.liveness import Liveness, liveness
from coordination.model import LIVE_STATUSES
from groups import shardstats
from groups.models import Group, ShardVersion, Stream, SweepRun, VersionState
from members.models import Member


@dataclass(frozen=True)
class GroupLine:
    group: Group
    live: int
    late: int  # late or expired, by the one classifier
    stats: shardstats.GroupStats


def dashboard(now: datetime) -> dict[str, Any]:
    streams = list(Stream.objects.order_by("name"))
    versions: dict[int, list[ShardVersion]] = {}
    for v in ShardVersion.objects.exclude(state=VersionState.RETIRED).order_by("version"):
        versions.setdefault(v.stream_id, []).append(v)
    # Reshard progress: shards of sealed versions drained, over all groups of the stream.
    progress = {
        r["group__stream_id"]: (r["drained"], r["total"])
        for r in ShardAssignment.objects.filter(shard__version__state=VersionState.SEALED)
        .values("group__stream_id")
        .annotate(total=Count("id"), drained=Count("id", filter=Q(drained_at__isnull=False)))
    }
    stream_lines = [
        {"stream": s, "versions": versions.get(s.pk, []), "progress": progress.get(s.pk)} for s in streams
    ]
    groups = list(Group.objects.select_related("stream").order_by("name"))
    live_rows = Member.objects.filter(status__in=[st.value for st in LIVE_STATUSES]).values_list(
        "group_id", "last_heartbeat_at"
    )
    by_pk = {g.pk: g for g in groups}
    live: dict[int, int] = {}
    late: dict[int, int] = {}
    for group_id, last in live_rows:
        g = by_pk.get(group_id)
        if g is None:
            continue
        live[group_id] = live.get(group_id, 0) + 1
        _, alive = liveness(last, now, g.heartbeat_interval_ms, g.session_timeout_ms)
        if alive in (Liveness.LATE, Liveness.EXPIRED, Liveness.UNKNOWN):
            late[group_id] = late.get(group_id, 0) + 1
    shard_ids: dict[int, list[str]] = {}
    group_lines = []
    for g in groups:
        ids = shard_ids.get(g.stream_id)
        if ids is None:
            ids = shard_ids[g.stream_id] = shardstats.live_shard_ids(g.stream_id)
        stats = shardstats.shard_stats(g.name, g.stream.key_prefix, ids)
        group_lines.append(GroupLine(g, live.get(g.pk, 0), late.get(g.pk, 0), stats))
    return {
        "streams": stream_lines,
        "groups": group_lines,
        "sweeps": list(SweepRun.objects.order_by("name")),
        "now": now,
    }
