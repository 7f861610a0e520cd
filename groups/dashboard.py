"""The admin index dashboard: streams with state and reshard progress; groups with live and
late members, total lag, pending and DLQ; when each sweep last ran. Aggregate queries plus the
cached shard statistics (≤ 2 s old), so its cost does not grow with members × shards. The
queries are the apps' selectors; liveness is `coordination.liveness`'s."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from assignments import selectors as assignment_selectors
from coordination.liveness import NEEDS_ATTENTION
from groups import selectors, shardstats
from groups.models import Group
from groups.namespace import observe_generation
from members import selectors as member_selectors


@dataclass(frozen=True)
class GroupLine:
    group: Group
    live: int
    late: int  # late or expired, by the one classifier
    stats: shardstats.GroupStats


def dashboard(now: datetime) -> dict[str, Any]:
    observe_generation()  # after a restore, no cached figure of the old history
    versions = selectors.live_versions_by_stream()
    progress = assignment_selectors.sealed_drain_by_stream()
    stream_lines = [
        {"stream": s, "versions": versions.get(s.pk, []), "progress": progress.get(s.pk)}
        for s in selectors.streams()
    ]
    by_liveness = member_selectors.liveness_by_group(now)
    shard_ids: dict[int, tuple[str, ...]] = {}
    group_lines = []
    for g in selectors.groups_with_streams():
        ids = shard_ids.get(g.stream_id)
        if ids is None:
            ids = shard_ids[g.stream_id] = selectors.live_shard_ids(g.stream_id, g.stream.metadata_epoch)
        stats = shardstats.shard_stats(g.name, g.stream.key_prefix, ids)
        counts = by_liveness.get(g.pk, Counter())
        late = sum(counts[s] for s in NEEDS_ATTENTION)
        group_lines.append(GroupLine(g, sum(counts.values()), late, stats))
    return {
        "streams": stream_lines,
        "groups": group_lines,
        "sweeps": selectors.sweep_runs(),
        "now": now,
    }
