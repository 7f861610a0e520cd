"""The metadata document of a group (§3) and the routing document of a stream (§6).

Both describe live shard versions; they are cached per process by (id, metadataEpoch),
which every change they show raises.
"""
from __future__ import annotations

from typing import Any

from rest_framework.renderers import JSONRenderer

from coordinator_project.process_state import PROCESS, ProcessCache
from dataplane.routing import HASH_ALGORITHM
from dataplane.routing import ShardVersion as RoutingVersion
from groups.models import Group, Installation, ShardVersion, Stream, VersionState

_cache: ProcessCache[tuple[str, int, int], dict[str, Any]] = PROCESS.own(
    "metadata documents", ProcessCache(),
    "key: ('group', group id, group metadataEpoch) or ('stream', stream id, stream"
    " metadataEpoch) -> document; bound: 1,024, then emptied; invalidated: a new metadataEpoch"
    " (every change a document shows raises it); N hosts: one document per epoch everywhere.",
)
# The entry keeps the document alive, so the id is not reused while the entry exists.
_rendered: ProcessCache[int, tuple[dict[str, Any], bytes]] = PROCESS.own(
    "rendered metadata documents", ProcessCache(),
    "The JSON text of cached documents. key: the id() of a document of _cache -> (document,"
    " bytes); bound: 64, then emptied; invalidated: with its document; N hosts: as _cache.",
)


def versions_document(stream: Stream) -> list[dict[str, Any]]:
    """Each live version by stream, version, state, shard count, parent version and key
    prefix (§3): members and producers derive every shard's id, keys, hash range and parents
    from these with ``dataplane.routing``, so the size does not grow with the shard count."""
    rows = list(
        ShardVersion.objects.filter(stream=stream).order_by("version").values_list("version", "shard_count", "state")
    )
    counts = {version: count for version, count, _ in rows}
    first = rows[0][0] if rows else None
    return [
        RoutingVersion(
            stream=stream.name,
            version=version,
            shard_count=count,
            state=state,
            # A version's shards have the previous version's as parents (resharding), except
            # the stream's first version's.
            parent_version=None if version == first else version - 1,
            parent_shard_count=None if version == first else counts.get(version - 1),
            key_prefix=stream.key_prefix,
        ).document()
        for version, count, state in rows
        if state != VersionState.RETIRED
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
            # Issue 25.4: members compare it with <keyPrefix>:identity in their Redis before
            # their first read (a fixed 32 characters: the size stays constant).
            # (made with the first stream: groups.namespace.installation_id; None before).
            "installationId": Installation.objects.filter(pk=1).values_list("installation_id", flat=True).first(),
            # No streamState: the document is cached by the group's metadataEpoch, which the
            # PREPARING -> SEALING step does not raise (members have nothing to act on), so it
            # would differ between processes for one epoch (issue 23.2). The versions' states
            # show what members act on; describe and the routing document show the stream's.
            "writeVersion": stream.write_version,
            "hash": HASH_ALGORITHM,
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

    Every join and every R7 answer carries the group's whole metadata document (a few hundred
    bytes per live version since it stopped listing shards; it was ~800 KB at 4,096 shards).
    The document is the same until its metadataEpoch changes, so its text is too.
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
