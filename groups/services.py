"""Creating streams, groups and API keys; resolving keys. The only writers of these rows."""
from __future__ import annotations

import hashlib
import logging
import re
import secrets
import time
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from assignments.models import ShardAssignment
from assignments.store import lock_group
from coordination.shardmath import shard_id
from groups.models import ApiKey, Event, Group, Shard, ShardVersion, StartPosition, Stream, VersionState

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


def create_stream(name: str, shards: int, key_prefix: str | None = None) -> Stream:
    """A stream with `shards` shards (version 1); its Redis keys start with `key_prefix`.

    The prefix defaults to this installation's namespace (`rsc-<id8>`, groups.namespace).
    Refused when Redis already holds keys of these shards: this database did not write them.
    """
    # groups.namespace imports ServiceError from this module.
    from groups.namespace import check_new_shards, claim_prefix, default_key_prefix

    if not STREAM_NAME_RE.match(name or ""):
        raise ServiceError(f"stream name {name!r} must be 1-200 characters of [A-Za-z0-9._-]")
    _check_int("shards", shards, 1, MAX_SHARDS)
    key_prefix = key_prefix or default_key_prefix()
    if not KEY_PREFIX_RE.match(key_prefix):
        raise ServiceError(f"key prefix {key_prefix!r} must be 1-64 characters of [A-Za-z0-9._-]")
    if Stream.objects.filter(name=name).exists():
        raise ServiceError(f"stream {name!r} already exists")
    claim_prefix(key_prefix)
    check_new_shards(key_prefix, (shard_id(name, 1, i) for i in range(shards)))
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
    validate_group_config(
        heartbeat_interval_ms=heartbeat_interval_ms,
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        max_members=max_members,
        start_position=start_position,
    )
    from groups.namespace import check_new_shards  # imports ServiceError from here

    stream_row = Stream.objects.filter(name=stream).first()
    if stream_row is None:
        raise ServiceError(f"stream {stream!r} does not exist")
    if Group.objects.filter(name=name).exists():
        raise ServiceError(f"group {name!r} already exists")
    live_shards = Shard.objects.filter(version__stream=stream_row).exclude(version__state=VersionState.RETIRED)
    # Fence tokens of a group this database never had would refuse its members' grants.
    check_new_shards(stream_row.key_prefix, live_shards.values_list("shard_id", flat=True), groups=[name])
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
            ShardAssignment.objects.bulk_create(
                ShardAssignment(group=group, shard=s) for s in live_shards.only("id")
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


# --- group configuration (admin, CLI) -------------------------------------------------------
log = logging.getLogger(__name__)

# What an operator may change on a group; names, the stream and every epoch are not settings.
GROUP_CONFIG_FIELDS = (
    "heartbeat_interval_ms", "session_timeout_ms", "rebalance_timeout_ms", "max_members", "start_position",
)


def validate_group_config(
    *,
    heartbeat_interval_ms: int,
    session_timeout_ms: int,
    rebalance_timeout_ms: int,
    max_members: int,
    start_position: str,
) -> None:
    """The bounds create_group enforces, for a complete set of settings (forms call it too)."""
    _check_int("heartbeat interval (ms)", heartbeat_interval_ms, 10, MAX_TIMEOUT_MS)
    _check_int("session timeout (ms)", session_timeout_ms, 100, MAX_TIMEOUT_MS)
    _check_int("rebalance timeout (ms)", rebalance_timeout_ms, 100, MAX_TIMEOUT_MS)
    _check_int("max members", max_members, 1, 100_000)
    if session_timeout_ms <= heartbeat_interval_ms:
        raise ServiceError("session timeout must be longer than the heartbeat interval")
    if start_position not in StartPosition.values:
        raise ServiceError(f"start position must be one of {', '.join(StartPosition.values)}")


def update_group_config(name: str, /, *, actor: str, **fields: object) -> Group:
    """Change a group's settings; members learn them through metadataEpoch (R7, SYNC_METADATA).

    Validated as a whole (the new values merged over the current ones) under the group's row
    lock, so two concurrent edits cannot combine into an invalid pair. No-op edits change
    nothing: no epoch bump, no event.
    """
    unknown = sorted(set(fields) - set(GROUP_CONFIG_FIELDS))
    if unknown:
        raise ServiceError(
            f"not a group setting: {', '.join(unknown)} (settings: {', '.join(GROUP_CONFIG_FIELDS)})"
        )
    with transaction.atomic():
        group = lock_group(name)
        if group is None:
            raise ServiceError(f"group {name!r} does not exist")
        current = {f: getattr(group, f) for f in GROUP_CONFIG_FIELDS}
        validate_group_config(**{**current, **fields})  # type: ignore[arg-type]
        changed = {f: v for f, v in fields.items() if current[f] != v}
        if not changed:
            return group
        for f, v in changed.items():
            setattr(group, f, v)
        # Under the row lock, so read-increment-write cannot lose a concurrent bump.
        group.metadata_epoch += 1
        group.save(update_fields=[*changed, "metadata_epoch"])
        detail = {f: {"from": current[f], "to": v} for f, v in changed.items()}
        Event.objects.create(
            kind="config_changed", group=group, stream_id=group.stream_id, actor=actor,
            group_epoch=group.group_epoch, detail={**detail, "metadataEpoch": group.metadata_epoch},
        )
    log.info(
        "config_changed group=%s by %s: %s", name, actor, ", ".join(f"{f}={v}" for f, v in changed.items()),
        extra={"event": "config_changed", "group": name, "groupEpoch": group.group_epoch},
    )
    return group
