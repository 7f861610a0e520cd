"""The metadata document of a group (§3) and the routing document of a stream (§6).

Both describe live shard versions; they are cached per process by (id, metadataEpoch),
which every change they show raises.
"""
from __future__ import annotations

from typing import Any

from rest_framework.renderers import JSONRenderer

from dataplane.routing import HASH_ALGORITHM, ShardKeys, hash_range
from groups.models import Group, Shard, ShardVersion, Stream, VersionState

_cache: dict[tuple[str, int, int], dict[str, Any]] = {}
# The JSON text of cached documents, by the document's id (the entry keeps the document alive,
# so the id is not reused while the entry exists).
_rendered: dict[int, tuple[dict[str, Any], bytes]] = {}


def versions_document(stream: Stream) -> list[dict[str, Any]]:
    versions = list(
        ShardVersion.objects.filter(stream=stream).exclude(state=VersionState.RETIRED).order_by("version")
    )
    shards_by_version: dict[int, list[Shard]] = {}
    for shard in Shard.objects.filter(version__in=versions).order_by("index"):
        shards_by_version.setdefault(shard.version_id, []).append(shard)
    return [
        {
            "version": v.version,
            "state": v.state,
            "shardCount": v.shard_count,
            "shards": [
                {
                    "shardId": s.shard_id,
                    "index": s.index,
                    "redisKey": ShardKeys(s.shard_id, stream.key_prefix).stream,
                    "sealKey": ShardKeys(s.shard_id, stream.key_prefix).sealed,
                    "hashRange": list(hash_range(s.index, v.shard_count)),
                    "parents": list(s.parents),
                }
                for s in shards_by_version.get(v.pk, [])
            ],
        }
        for v in versions
    ]


def group_metadata(group: Group) -> dict[str, Any]:
    key = ("group", group.pk, group.metadata_epoch)
    doc = _cache.get(key)
    if doc is None:
        stream = group.stream
        doc = {
            "metadataEpoch": group.metadata_epoch,
            "group": group.name,
            "stream": stream.name,
            "heartbeatIntervalMs": group.heartbeat_interval_ms,
            "sessionTimeoutMs": group.session_timeout_ms,
            "rebalanceTimeoutMs": group.rebalance_timeout_ms,
            "startPosition": group.start_position,
            "keyPrefix": stream.key_prefix,
            "streamState": stream.state,
            "writeVersion": stream.write_version,
            "versions": versions_document(stream),
        }
        if len(_cache) > 1024:
            _cache.clear()
        _cache[key] = doc
    return doc


def routing_document(stream: Stream) -> dict[str, Any]:
    key = ("stream", stream.pk, stream.metadata_epoch)
    doc = _cache.get(key)
    if doc is None:
        doc = {
            "stream": stream.name,
            "writeVersion": stream.write_version,
            "metadataEpoch": stream.metadata_epoch,
            "state": stream.state,
            "hash": HASH_ALGORITHM,
            "keyPrefix": stream.key_prefix,
            "versions": versions_document(stream),
        }
        if len(_cache) > 1024:
            _cache.clear()
        _cache[key] = doc
    return doc


def rendered(doc: dict[str, Any]) -> bytes | None:
    """The compact JSON text of a document this module returned (None for any other dict).

    Every join and every R7 answer carries the group's whole metadata document (~800 KB for
    4,096 shards): rendering it per answer cost ~7 ms of a worker's CPU, a join storm's largest
    share. The document is the same until its metadataEpoch changes, so its text is too.
    """
    entry = _rendered.get(id(doc))
    if entry is not None and entry[0] is doc:
        return entry[1]
    if not any(cached is doc for cached in _cache.values()):
        return None
    text_bytes = JSONRenderer().render(doc)  # the answer's own renderer and settings
    if len(_rendered) > 64:
        _rendered.clear()
    _rendered[id(doc)] = (doc, text_bytes)
    return text_bytes
