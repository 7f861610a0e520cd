"""Read queries about streams, groups, events and sweeps, for the admin, describe, the
dashboard and the metrics. Never a write, never a lock (services write; docs/ARCHITECTURE.md,
Layers)."""
from __future__ import annotations

from django.db.models import Count, Q, QuerySet

from coordination.model import LIVE_STATUSES
from coordinator_project.process_state import PROCESS, ProcessCache
from dataplane.routing import shard_sort_key
from groups import shardstats
from groups.models import Event, Group, Shard, ShardVersion, Stream, SweepRun, VersionState

_LIVE = [s.value for s in LIVE_STATUSES]


def group_exists(name: str) -> bool:
    return Group.objects.filter(name=name).exists()


def group_with_stream(name: str) -> Group | None:
    return Group.objects.select_related("stream").filter(name=name).first()


def groups_with_streams() -> list[Group]:
    return list(Group.objects.select_related("stream").order_by("name"))


def with_live_member_counts(groups: QuerySet[Group]) -> QuerySet[Group]:
    """Each group annotated with `live_count`, its live members."""
    return groups.annotate(live_count=Count("members", filter=Q(members__status__in=_LIVE)))


def streams() -> list[Stream]:
    return list(Stream.objects.order_by("name"))


def live_versions_by_stream() -> dict[int, list[ShardVersion]]:
    """Not retired versions per stream pk, oldest first."""
    versions: dict[int, list[ShardVersion]] = {}
    for v in ShardVersion.objects.exclude(state=VersionState.RETIRED).order_by("version"):
        versions.setdefault(v.stream_id, []).append(v)
    return versions


def version_counts() -> dict[tuple[str, str], int]:
    """(stream name, version state) → how many versions."""
    return {
        (r["stream__name"], r["state"]): r["n"]
        for r in ShardVersion.objects.values("stream__name", "state").annotate(n=Count("id"))
    }


def sweep_runs() -> list[SweepRun]:
    return list(SweepRun.objects.order_by("name"))


def group_events(group: Group, limit: int = 20) -> list[Event]:
    """The group's events and its stream's (reshard started, sealed, retired), newest first."""
    return list(
        Event.objects.filter(Q(group=group) | Q(group__isnull=True, stream_id=group.stream_id))
        .select_related("group", "stream").order_by("-created_at", "-id")[:limit]
    )


# Live shard ids in display order, kept per (stream, metadataEpoch): at 16,384 shards reading
# them cost every describe and page tens of milliseconds (issue 26.3).
_live_ids: ProcessCache[tuple[int, int], tuple[str, ...]] = PROCESS.own(
    "live shard ids", ProcessCache(),
    "A stream's live (not retired) shard ids in order. key: (stream id, stream metadataEpoch);"
    " bound: 64 entries, then emptied; invalidated: a new stream metadataEpoch (every change of"
    " versions raises it); N hosts: every host reads the same rows for one epoch.",
)


def live_shard_ids(stream_id: int, metadata_epoch: int | None = None) -> tuple[str, ...]:
    """The stream's live shard ids in order; kept for a stream metadataEpoch when given."""
    key = (stream_id, metadata_epoch if metadata_epoch is not None else -1)
    hit = _live_ids.get(key) if metadata_epoch is not None else None
    if hit is None:
        hit = tuple(
            Shard.objects.filter(version__stream_id=stream_id)
            .exclude(version__state=VersionState.RETIRED)
            .order_by("version__version", "index")
            .values_list("shard_id", flat=True)
        )
        if metadata_epoch is not None:
            if len(_live_ids) >= 64:
                _live_ids.clear()
            _live_ids[key] = hit
    return hit


def live_shard_keys(stream_id: int, metadata_epoch: int) -> dict[str, tuple[int, int]]:
    """Live shard id -> (version, index), in natural order, kept with the ids (issue 26.3)."""
    key = (stream_id, -2 - metadata_epoch)  # beside the ids' entry, same bound and invalidation
    hit = _parsed.get(key)
    if hit is None:
        hit = {sid: shard_sort_key(sid)[1:] for sid in live_shard_ids(stream_id, metadata_epoch)}
        if len(_parsed) >= 64:
            _parsed.clear()
        _parsed[key] = hit
    return hit


_parsed: ProcessCache[tuple[int, int], dict[str, tuple[int, int]]] = PROCESS.own(
    "live shard keys", ProcessCache(),
    "A stream's live shard ids parsed into (version, index). key: (stream id, stream"
    " metadataEpoch); bound: 64 entries, then emptied; invalidated: a new stream metadataEpoch"
    " (every change of versions raises it); N hosts: every host parses the same ids.",
)


def group_shard_stats(group: Group, *, fresh: bool = False) -> shardstats.GroupStats:
    """The Redis figures (lag, pending, DLQ) of a group on its live (not retired) shards."""
    ids = live_shard_ids(group.stream_id, group.stream.metadata_epoch)
    return shardstats.shard_stats(group.name, group.stream.key_prefix, ids, fresh=fresh)
