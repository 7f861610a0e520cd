"""Creating streams, groups and API keys; resolving keys. The only writers of these rows."""
from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from assignments.models import ShardAssignment
from coordination.shardmath import shard_id
from groups.models import ApiKey, Group, Shard, ShardVersion, StartPosition, Stream, VersionState

STREAM_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")  # no ':' — shard ids are stream:v:i
GROUP_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
KEY_PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
MAX_SHARDS = 16_384
MAX_TIMEOUT_MS = 24 * 3600 * 1000


class ServiceError(ValueError):
    """Bad input to a service: the message names the field and is safe to show."""


def _check_int(field: str, value: int, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ServiceError(f"{field} must be a whole number from {lo} to {hi}, got {value!r}")
    return value


def create_stream(name: str, shards: int, key_prefix: str = "rsc") -> Stream:
    if not STREAM_NAME_RE.match(name or ""):
        raise ServiceError(f"stream name {name!r} must be 1-200 characters of [A-Za-z0-9._-]")
    _check_int("shards", shards, 1, MAX_SHARDS)
    if not KEY_PREFIX_RE.match(key_prefix or ""):
        raise ServiceError(f"key prefix {key_prefix!r} must be 1-64 characters of [A-Za-z0-9._-]")
    try:
        with transaction.atomic():
            stream = Stream.objects.create(name=name, key_prefix=key_prefix, write_version=1)
            version = ShardVersion.objects.create(stream=stream, version=1, shard_count=shards)
            Shard.objects.bulk_create(
                Shard(version=version, shard_id=shard_id(name, 1, i), index=i, parents=[])
                for i in range(shards)
            )
    except IntegrityError as exc:
        raise ServiceError(f"stream {name!r} already exists") from exc
    return stream


def create_group(
    name: str,
    stream: str,
    *,
    heartbeat_interval_ms: int = 3000,
    session_timeout_ms: int = 30_000,
    rebalance_timeout_ms: int = 60_000,
    max_members: int = 1000,
    start_position: str = StartPosition.EARLIEST,
) -> Group:
    if not GROUP_NAME_RE.match(name or ""):
        raise ServiceError(f"group name {name!r} must be 1-200 characters of [A-Za-z0-9._-]")
    _check_int("heartbeat interval (ms)", heartbeat_interval_ms, 10, MAX_TIMEOUT_MS)
    _check_int("session timeout (ms)", session_timeout_ms, 100, MAX_TIMEOUT_MS)
    _check_int("rebalance timeout (ms)", rebalance_timeout_ms, 100, MAX_TIMEOUT_MS)
    _check_int("max members", max_members, 1, 100_000)
    if session_timeout_ms <= heartbeat_interval_ms:
        raise ServiceError("session timeout must be longer than the heartbeat interval")
    if start_position not in StartPosition.values:
        raise ServiceError(f"start position must be one of {', '.join(StartPosition.values)}")
    stream_row = Stream.objects.filter(name=stream).first()
    if stream_row is None:
        raise ServiceError(f"stream {stream!r} does not exist")
    try:
        with transaction.atomic():
            group = Group.objects.create(
                name=name,
                stream=stream_row,
                heartbeat_interval_ms=heartbeat_interval_ms,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms,
                max_members=max_members,
                start_position=start_position,
            )
            live = Shard.objects.filter(version__stream=stream_row).exclude(
                version__state=VersionState.RETIRED
            )
            ShardAssignment.objects.bulk_create(
                ShardAssignment(group=group, shard=s) for s in live.only("id")
            )
    except IntegrityError as exc:
        raise ServiceError(f"group {name!r} already exists") from exc
    return group


# --- API keys ------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyScope:
    key_id: int
    group: str | None
    stream: str  # the group's stream for a group key


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def create_api_key(*, group: str | None = None, stream: str | None = None, name: str = "") -> str:
    """Make a key for one group or one stream; returns the raw key (shown once)."""
    if (group is None) == (stream is None):
        raise ServiceError("give exactly one of group or stream")
    raw = "rsc_" + secrets.token_urlsafe(32)
    if group is not None:
        g = Group.objects.filter(name=group).first()
        if g is None:
            raise ServiceError(f"group {group!r} does not exist")
        ApiKey.objects.create(name=name, prefix=raw[:12], key_hash=_hash(raw), group=g)
    else:
        s = Stream.objects.filter(name=stream).first()
        if s is None:
            raise ServiceError(f"stream {stream!r} does not exist")
        ApiKey.objects.create(name=name, prefix=raw[:12], key_hash=_hash(raw), stream=s)
    return raw


# Successful lookups are cached briefly: the key check sits on every heartbeat.
_KEY_TTL_S = 10.0
_key_cache: dict[str, tuple[float, KeyScope]] = {}


def resolve_api_key(raw: str) -> KeyScope | None:
    digest = _hash(raw)
    hit = _key_cache.get(digest)
    now = time.monotonic()
    if hit and hit[0] > now:
        return hit[1]
    row = (
        ApiKey.objects.filter(key_hash=digest, revoked_at__isnull=True)
        .select_related("group__stream", "stream")
        .first()
    )
    if row is None:
        _key_cache.pop(digest, None)
        return None
    if row.group_id:
        scope = KeyScope(row.pk, row.group.name, row.group.stream.name)
    else:
        scope = KeyScope(row.pk, None, row.stream.name)
    if len(_key_cache) > 10_000:
        _key_cache.clear()
    _key_cache[digest] = (now + _KEY_TTL_S, scope)
    return scope


def clear_key_cache() -> None:
    _key_cache.clear()
