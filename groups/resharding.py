"""Resharding (PROTOCOL.md §6): STABLE → PREPARING → SEALING → DRAINING → STABLE.

`start_reshard` creates version v+1 (parent links from hash-range overlap) and moves the
stream to PREPARING; `advance_resharding` (the periodic sweep) seals v — writes the seal
marker of every shard of v in Redis, then marks v SEALED — and retires v once every group
has drained it and nobody holds a shard of it any more.

Per-group decisions (which shard is assignable, what a drained report does) stay in the
core (`coordination.engine.s6_*`); this module only creates rows, raises metadata epochs,
writes seal markers and moves the stream's state, each step under the stream's row lock.

Lock order, shared by every writer here: the stream row (FOR NO KEY UPDATE, so heartbeats
inserting events that reference the stream never wait for it), then groups by name.
Heartbeats and liveness sweeps lock a single group, so no cycle is possible.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime
from functools import cache
from typing import Any

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from assignments.models import ShardAssignment
from assignments.rows import load_state, lock_group
from assignments.writer import add_slots, delete_retired_slots, raise_metadata_epoch, save_state
from coordination import engine
from coordinator_project.process_state import PROCESS
from dataplane.routing import ShardKeys, parent_indexes, shard_id
from groups.errors import ServiceError
from groups.models import Event, Group, Shard, ShardVersion, Stream, StreamState, VersionState
from groups.namespace import check_new_shards, claim_prefix, create_consumer_groups
from groups.services import _check_int, shard_cap

log = logging.getLogger(__name__)


class StreamNotFound(ServiceError):
    """No stream of that name."""


class ReshardInProgress(ServiceError):
    """The stream is not STABLE: one reshard at a time."""


# --- starting a reshard ----------------------------------------------------------------------
def start_reshard(stream: str, shards: int, *, actor: str = "operator") -> ShardVersion:
    """§6.1: create version v+1 with N shards; producers route to it, members learn it (R7).

    Refused (ServiceError, nothing changed) for an unknown stream, a count outside
    1..shard_cap() (settings.MAX_SHARDS_PER_STREAM), the current count, or while a reshard of this stream is still running.
    """
    _check_int("shards", shards, 1, shard_cap())
    now = timezone.now()
    with transaction.atomic():
        row = _lock_stream(stream)
        if row is None:
            raise StreamNotFound(f"stream {stream!r} does not exist")
        if row.state != StreamState.STABLE:
            raise ReshardInProgress(
                f"stream {stream!r} is already resharding (state {row.state}, write version "
                f"{row.write_version}); wait until it is STABLE again"
            )
        current = ShardVersion.objects.get(stream=row, version=row.write_version)
        if shards == current.shard_count:
            raise ServiceError(f"stream {stream!r} already has {shards} shards (version {current.version})")
        # Keys of the new version already in Redis were not written by this database (issue 12).
        claim_prefix(row.key_prefix)
        check_new_shards(row.key_prefix, (shard_id(row.name, current.version + 1, i) for i in range(shards)))
        new = ShardVersion.objects.create(
            stream=row, version=current.version + 1, shard_count=shards, state=VersionState.ACTIVE
        )
        Shard.objects.bulk_create(
            Shard(
                version=new,
                shard_id=shard_id(row.name, new.version, i),
                index=i,
                parents=[
                    shard_id(row.name, current.version, p)
                    for p in parent_indexes(i, shards, current.shard_count)
                ],
            )
            for i in range(shards)
        )
        _set_stream_state(row, StreamState.PREPARING, now, write_version=new.version)
        for group in _groups_of(row):
            _sync_group(group, now, raise_metadata=True)
        Event.objects.create(
            kind="reshard_started", stream=row, actor=actor,
            detail={"fromVersion": current.version, "fromShards": current.shard_count,
                    "toVersion": new.version, "toShards": shards},
        )
    log.info("reshard %s: v%s (%s shards) -> v%s (%s shards) by %s",
             stream, current.version, current.shard_count, new.version, shards, actor)
    return new


# --- the periodic part ---------------------------------------------------------------------
def advance_resharding(now: datetime | None = None) -> dict[str, Any]:
    """One pass over every stream that is resharding: seal, then retire what is drained.

    Safe with several sweepers at once: each step takes the stream's row lock and re-checks
    the state under it, so a second sweeper waits and then finds the step done; seal markers
    are written with SET NX, so even a repeat would change nothing.
    """
    now = now or timezone.now()
    result: dict[str, Any] = {}
    names = list(Stream.objects.exclude(state=StreamState.STABLE).order_by("name").values_list("name", flat=True))
    for name in names:
        steps = _advance_stream(name, now)
        if steps:
            result[name] = steps
    return result


def _advance_stream(name: str, now: datetime) -> dict[str, Any]:
    steps: dict[str, Any] = {}
    with transaction.atomic():
        row = _lock_stream(name)
        if row is not None and row.state == StreamState.PREPARING:
            # Committed on its own so SEALING shows while (or if) the markers are being written.
            _set_stream_state(row, StreamState.SEALING, now)
            Event.objects.create(kind="reshard_sealing", stream=row, actor="sweeper")
            steps["state"] = StreamState.SEALING.value
    try:
        with transaction.atomic():
            row = _lock_stream(name)
            if row is not None and row.state == StreamState.SEALING:
                steps.update(_seal(row, now))
    except redis.RedisError as exc:
        # Rolled back: the stream stays SEALING and the next tick retries (SET NX is idempotent).
        log.warning("reshard %s: writing seal markers failed: %s", name, exc)
        steps.update(state=StreamState.SEALING.value, error=f"seal markers not written: {exc}")
        return steps
    with transaction.atomic():
        row = _lock_stream(name)
        if row is not None and row.state == StreamState.DRAINING:
            steps.update(_drain_or_retire(row, now))
    return steps


def _seal(row: Stream, now: datetime) -> dict[str, Any]:
    """§6.2: seal markers first, then SEALED in the database (drained reports count from here)."""
    versions = list(
        ShardVersion.objects.filter(stream=row, state=VersionState.ACTIVE, version__lt=row.write_version)
    )
    keys: list[tuple[str, str]] = []
    for v in versions:
        marker = json.dumps({"stream": row.name, "version": v.version, "successor": row.write_version,
                             "sealedAt": now.isoformat()})
        shard_ids = Shard.objects.filter(version=v).order_by("index").values_list("shard_id", flat=True)
        keys.extend((ShardKeys(s, row.key_prefix).sealed, marker) for s in shard_ids)
    # The new version's consumer groups, at 0, before any of its shards can be granted (a child
    # is granted once its parents drained, which needs the markers): members need no
    # xgroup|create (issue 27.6). Idempotent (BUSYGROUP keeps a group), retried with the markers.
    new_shards = Shard.objects.filter(version__stream=row, version__version=row.write_version)
    create_consumer_groups(
        row.key_prefix,
        [(s, "0") for s in new_shards.values_list("shard_id", flat=True)],
        Group.objects.filter(stream=row).order_by("name").values_list("name", flat=True),
    )
    _write_seal_markers(keys)  # raises: the transaction rolls back, state stays SEALING
    ShardVersion.objects.filter(pk__in=[v.pk for v in versions]).update(state=VersionState.SEALED, sealed_at=now)
    _set_stream_state(row, StreamState.DRAINING, now)
    for group in _groups_of(row):
        _sync_group(group, now, raise_metadata=True)
    sealed = [v.version for v in versions]
    Event.objects.create(kind="version_sealed", stream=row, actor="sweeper",
                         detail={"versions": sealed, "sealMarkers": len(keys)})
    return {"state": StreamState.DRAINING.value, "sealed": sealed, "sealMarkers": len(keys)}


def _drain_or_retire(row: Stream, now: datetime) -> dict[str, Any]:
    """§6.4: a sealed version every group drained, and nobody holds, is retired."""
    sealed = list(ShardVersion.objects.filter(stream=row, state=VersionState.SEALED))
    _repair_missing_slots(row, now)
    # Unlocked, and still exact: "drained and released" is terminal for a slot (a drained
    # shard is never assignable again), so a version seen done stays done.
    waiting: dict[str, dict[str, int]] = {}
    busy = (
        ShardAssignment.objects.filter(group__stream=row, shard__version__in=sealed)
        .filter(Q(drained_at__isnull=True) | Q(owner__isnull=False))
        .values_list("shard__version__version", "group__name")
        .annotate(n=Count("id"))
    )
    for version, group_name, n in busy:
        waiting.setdefault(str(version), {})[group_name] = n
    retired = [v for v in sealed if str(v.version) not in waiting]
    if not retired:
        return {"waiting": waiting}
    groups = _groups_of(row)  # locked: no heartbeat of these groups is mid-flight
    ShardVersion.objects.filter(pk__in=[v.pk for v in retired]).update(state=VersionState.RETIRED, retired_at=now)
    # The slots of retired shards are no longer loaded; drop them (a group created in the
    # same instant may leave a few behind: harmless, and removed at the next retirement).
    delete_retired_slots(row)
    done = len(retired) == len(sealed)
    _set_stream_state(row, StreamState.STABLE if done else StreamState.DRAINING, now)
    for group in groups:
        raise_metadata_epoch(group)  # the metadata document no longer lists them
    versions = [v.version for v in retired]
    Event.objects.create(kind="version_retired", stream=row, actor="sweeper", detail={"versions": versions})
    out: dict[str, Any] = {"retired": versions}
    if done:
        out["state"] = StreamState.STABLE.value
    if waiting:
        out["waiting"] = waiting
    return out


def _repair_missing_slots(row: Stream, now: datetime) -> None:
    """A group created while the reshard started may lack the new version's slots: add them."""
    live = Shard.objects.filter(version__stream=row).exclude(version__state=VersionState.RETIRED).count()
    short = (
        Group.objects.filter(stream=row)
        .annotate(n=Count("shard_assignments", filter=~Q(
            shard_assignments__shard__version__state=VersionState.RETIRED)))
        .filter(n__lt=live)
        .order_by("name")
        .values_list("name", flat=True)
    )
    for name in list(short):
        group = lock_group(name)
        if group is not None:
            _sync_group(group, now, raise_metadata=False)


# --- helpers ---------------------------------------------------------------------------------
def _lock_stream(name: str) -> Stream | None:
    # NO KEY UPDATE: heartbeats insert Event rows referencing the stream (FOR KEY SHARE) while
    # holding their group lock; a plain FOR UPDATE here would deadlock with them.
    # Blocking, not SKIP LOCKED: two sweepers skipping each other's short steps could both
    # end a pass with nothing done; waiting and re-checking the state does each step once.
    return Stream.objects.select_for_update(no_key=True).filter(name=name).first()


def _groups_of(row: Stream) -> list[Group]:
    """The stream's groups, each row-locked, in name order (the shared lock order)."""
    names = Group.objects.filter(stream=row).order_by("name").values_list("name", flat=True)
    return [g for g in (lock_group(n) for n in names) if g is not None]


def _set_stream_state(row: Stream, state: StreamState, now: datetime, **extra: Any) -> None:
    # Every state change is shown by the routing document, which is cached per metadataEpoch.
    Stream.objects.filter(pk=row.pk).update(
        state=state, state_changed_at=now, metadata_epoch=F("metadata_epoch") + 1, **extra
    )
    row.refresh_from_db()


def _sync_group(group: Group, now: datetime, *, raise_metadata: bool) -> None:
    """Give the (locked) group a slot for every live shard; let the core fix the target."""
    missing = list(
        Shard.objects.filter(version__stream_id=group.stream_id)
        .exclude(version__state=VersionState.RETIRED)
        .exclude(assignments__group=group)
        .values_list("pk", flat=True)
    )
    if missing:
        add_slots(group, missing)
    if raise_metadata or missing:
        raise_metadata_epoch(group)
    if missing:
        state, loaded = load_state(group)
        if engine.s6_refresh_assignable(state):
            save_state(state, loaded, now, actor="sweeper")


@cache
def _stream_redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


PROCESS.own("stream Redis clients (seal markers)", _stream_redis, "key: STREAM_REDIS_URL -> client; bound: one per URL; invalidated: never (a connection pool, no data); N hosts: holds no state.",
            reset=_stream_redis.cache_clear)


def _write_seal_markers(keys: list[tuple[str, str]]) -> None:
    """SET NX each marker (the first seal time wins), one round trip per 1000 keys.

    Every marker lives in its own shard's hash-tag slot, so against a Redis Cluster each
    key goes to its own node; the pipeline is not a transaction and needs none (idempotent).
    """
    client = _stream_redis(settings.STREAM_REDIS_URL)
    for start in range(0, len(keys), 1000):
        pipe = client.pipeline(transaction=False)
        for key, value in keys[start:start + 1000]:
            pipe.set(key, value, nx=True)
        pipe.execute()
