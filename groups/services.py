"""Creating streams, groups and API keys; resolving keys. The only writers of these rows."""
from __future__ import annotations

import functools
import getpass
import hashlib
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from assignments.rows import load_state, lock_group
from assignments.writer import create_group_rows, save_state, update_group_settings
from coordination import engine
from coordination.model import GroupState
from coordinator_project import dbpool, waiting
from coordinator_project.process_state import PROCESS, ProcessCache
from dataplane.routing import shard_id
from groups.errors import ServiceError
from groups.models import (
    ApiKey,
    Event,
    Group,
    KeyRole,
    Shard,
    ShardVersion,
    StartPosition,
    Stream,
    VersionState,
)
from groups.namespace import (
    check_new_shards,
    claim_prefix,
    create_consumer_groups,
    default_key_prefix,
    publish_identity,
)

# Full matches only (\A…\Z, fullmatch): `$` would also accept a trailing newline.
STREAM_NAME_RE = re.compile(r"\A[A-Za-z0-9._-]{1,200}\Z")  # no ':' — shard ids are stream:v:i
GROUP_NAME_RE = re.compile(r"\A[A-Za-z0-9._-]{1,200}\Z")
KEY_PREFIX_RE = re.compile(r"\A[A-Za-z0-9._-]{1,64}\Z")
MAX_SHARDS = 16_384  # hard ceiling; the operator's cap is settings.MAX_SHARDS_PER_STREAM
MAX_TIMEOUT_MS = 24 * 3600 * 1000


log = logging.getLogger(__name__)


def shard_cap() -> int:
    """Most shards one version may have: the routing document at 16,384 shards is 3.3 MB and
    goes into every full-metadata heartbeat, so operators cap it well below (default 1,024)."""
    return min(int(getattr(settings, "MAX_SHARDS_PER_STREAM", 1024)), MAX_SHARDS)


def default_actor() -> str:
    """Who ran a management command, for the event log (`cli:<user>`; every operator command)."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no passwd entry (containers)
        return "cli"


def url_name_problem(field: str, value: str) -> str | None:
    """Why a group or stream name taken from a URL cannot name one (None: it can).

    Checked before any query: PostgreSQL refuses a NUL byte in text (a 500, not a 404).
    """
    pattern = GROUP_NAME_RE if field == "group" else STREAM_NAME_RE
    if pattern.fullmatch(value):
        return None
    return f"{field}: must be 1-200 characters of [A-Za-z0-9._-], got {value!r}"


def _check_int(field: str, value: int, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ServiceError(f"{field} must be a whole number from {lo} to {hi}, got {value!r}")
    return value


def create_stream(name: str, shards: int, key_prefix: str | None = None) -> Stream:
    """A stream with `shards` shards (version 1); its Redis keys start with `key_prefix`.

    The prefix defaults to this installation's namespace (`rsc-<id8>`, groups.namespace).
    Refused when Redis already holds keys of these shards: this database did not write them.
    """
    if not STREAM_NAME_RE.fullmatch(name or ""):
        raise ServiceError(f"stream name {name!r} must be 1-200 characters of [A-Za-z0-9._-]")
    _check_int("shards", shards, 1, shard_cap())
    key_prefix = key_prefix or default_key_prefix()
    if not KEY_PREFIX_RE.fullmatch(key_prefix):
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
    if not GROUP_NAME_RE.fullmatch(name or ""):
        raise ServiceError(f"group name {name!r} must be 1-200 characters of [A-Za-z0-9._-]")
    validate_group_config(
        heartbeat_interval_ms=heartbeat_interval_ms,
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        max_members=max_members,
        start_position=start_position,
    )
    stream_row = Stream.objects.filter(name=stream).first()
    if stream_row is None:
        raise ServiceError(f"stream {stream!r} does not exist")
    if Group.objects.filter(name=name).exists():
        raise ServiceError(f"group {name!r} already exists")
    live_shards = Shard.objects.filter(version__stream=stream_row).exclude(version__state=VersionState.RETIRED)
    # Fence tokens of a group this database never had would refuse its members' grants.
    check_new_shards(stream_row.key_prefix, live_shards.values_list("shard_id", flat=True), groups=[name],
                     stream=stream_row.name)
    try:
        with transaction.atomic():
            group = create_group_rows(
                stream_row,
                live_shards.values_list("id", flat=True),
                name=name,
                heartbeat_interval_ms=heartbeat_interval_ms,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms,
                max_members=max_members,
                start_position=start_position,
            )
            # Last, so that a refusal rolls the rows back (a retry keeps what was made).
            ensure_consumer_groups(group)
            publish_identity([stream_row.key_prefix])  # issue 25.4: members check it
    except IntegrityError as exc:
        raise ServiceError(f"group {name!r} already exists") from exc
    return group


def consumer_group_start(parents: list[str], start_position: str) -> str:
    """Where a group's consumer group starts on a shard: ``$`` on a first-version shard of a
    group that starts at the latest entry, else ``0`` (the member's ``grant_from_metadata``
    used the same rule when it created them itself)."""
    return "$" if not parents and start_position == StartPosition.LATEST else "0"


def ensure_consumer_groups(group: Group, *, required: bool = False) -> int:
    """Create the group's missing consumer groups on every live shard (issue 27.6); an
    existing one is kept. Returns how many were created. See namespace.create_consumer_groups
    for a Redis user that may not (``required``: refuse, else log and go on)."""
    shards = Shard.objects.filter(version__stream_id=group.stream_id).exclude(
        version__state=VersionState.RETIRED
    ).values_list("shard_id", "parents")
    starts = [(sid, consumer_group_start(parents, group.start_position)) for sid, parents in shards]
    prefix = Stream.objects.values_list("key_prefix", flat=True).get(pk=group.stream_id)
    try:
        return create_consumer_groups(prefix, starts, [group.name], required=required)
    except redis.RedisError as exc:
        raise ServiceError(
            f"cannot create the consumer groups of {group.name!r} in the stream Redis "
            f"(STREAM_REDIS_URL): {exc}"
        ) from exc


# --- API keys ------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyScope:
    """What a resolved bearer key may touch (docs/SECURITY.md)."""

    key_id: int
    group: str | None
    stream: str  # the group's stream for a group key
    role: str = KeyRole.GROUP
    expires_at: float | None = None  # time.time() seconds; set during a rotation's grace

    def may_route(self, stream: str) -> bool:
        """Routing: a group key of a group on the stream, or a produce/admin key of it."""
        return self.stream == stream

    def may_reshard(self, stream: str) -> bool:
        return self.role == KeyRole.ADMIN and self.stream == stream


# Revocation must reach every web worker within 1 s (issue 8.6), so a resolved key is cached
# for at most that long: one indexed lookup per key per worker per second. Unknown keys are
# cached longer (nothing can make a random string valid later), in a separate bounded map so
# a flood of random keys only ever evicts other unknown keys.
KEY_CACHE_SECONDS = 1.0
NEGATIVE_CACHE_SECONDS = 5.0
KEY_CACHE_MAX = 10_000
MAX_KEY_LENGTH = 128  # ours are 47 characters; longer is not worth hashing
LAST_USED_EVERY = timedelta(minutes=1)
MAX_GRACE_SECONDS = 30 * 86_400
_key_cache: ProcessCache[str, tuple[float, KeyScope]] = PROCESS.own(
    "API keys", ProcessCache(),
    "key: SHA-256 of a bearer key -> (valid until, scope); bound: KEY_CACHE_MAX, then emptied;"
    " invalidated: KEY_CACHE_SECONDS (1 s), at once in this worker on revoke or rotate;"
    " N hosts: a revocation reaches every worker of every host within 1 s.",
)
_unknown_keys: ProcessCache[str, float] = PROCESS.own(
    "unknown API keys", ProcessCache(),
    "key: SHA-256 of a key no row has -> until when it is refused unseen; bound: KEY_CACHE_MAX,"
    " then emptied; invalidated: NEGATIVE_CACHE_SECONDS (5 s), on key creation in this worker;"
    " N hosts: a key created on another host works here within 5 s (keys are random: a guessed"
    " one never becomes valid).",
)
class _KeyFlight:
    """A key lookup in flight: its waiters get its scope, or its error."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.scope: KeyScope | None = None
        self.error: BaseException | None = None


_flights: ProcessCache[str, _KeyFlight] = PROCESS.own(
    "API key lookups in flight", ProcessCache(),
    "key: SHA-256 of a bearer key -> its one database lookup in flight; bound: one per key being"
    " looked up; invalidated: the lookup's end; N hosts: each is a fresh read.",
    reset=lambda: _forget_flights(),  # waiters keep the flight they hold; later keys look up anew
)
_flights_guard = threading.Lock()


def _forget_flights() -> None:
    with _flights_guard:
        _flights.clear()


@functools.lru_cache(maxsize=1024)
def _hash(raw: str) -> str:  # owned below (PROCESS: "API key hashes")
    # Memoized: every request hashes its key (a few µs of a steady heartbeat's ~0.3 ms beyond
    # the DRF ceiling); a process sees few distinct keys. Raw keys are in memory per request
    # anyway; a flood of random ones only churns this cache.
    return hashlib.sha256(raw.encode()).hexdigest()


PROCESS.own(
    "API key hashes", _hash,
    "key: a raw bearer key -> its SHA-256; bound: 1,024 (LRU); invalidated: never needed (a"
    " function of its key); N hosts: the same on every host.",
    reset=_hash.cache_clear,
)


def _new_key(**fields: object) -> tuple[str, ApiKey]:
    raw = "rsc_" + secrets.token_urlsafe(32)
    return raw, ApiKey.objects.create(prefix=raw[:12], key_hash=_hash(raw), **fields)


def create_api_key(
    *, group: str | None = None, stream: str | None = None, name: str = "", scope: str | None = None
) -> str:
    """Make a key for one group, or a `produce` (default) or `admin` key for one stream;
    returns the raw key (shown once, only its hash is stored)."""
    if (group is None) == (stream is None):
        raise ServiceError("give exactly one of group or stream")
    if group is not None:
        if scope not in (None, KeyRole.GROUP):
            raise ServiceError(f"scope {scope!r}: a group key has scope 'group'")
        g = Group.objects.filter(name=group).first()
        if g is None:
            raise ServiceError(f"group {group!r} does not exist")
        return _new_key(name=name, group=g, scope=KeyRole.GROUP)[0]
    scope = scope or KeyRole.PRODUCE
    if scope not in (KeyRole.PRODUCE, KeyRole.ADMIN):
        raise ServiceError(f"scope {scope!r}: a stream key has scope 'produce' or 'admin'")
    s = Stream.objects.filter(name=stream).first()
    if s is None:
        raise ServiceError(f"stream {stream!r} does not exist")
    return _new_key(name=name, stream=s, scope=scope)[0]


def find_api_key(prefix: str) -> ApiKey:
    """The one key whose shown prefix is (or starts with) `prefix`."""
    prefix = (prefix or "").strip()
    if len(prefix) < 6:
        raise ServiceError(f"key prefix {prefix!r}: give at least 6 characters, e.g. rsc_AbCdEfGh")
    rows = list(ApiKey.objects.filter(prefix=prefix).select_related("group", "stream")[:2]) or list(
        ApiKey.objects.filter(prefix__startswith=prefix).select_related("group", "stream")[:2]
    )
    if not rows:
        raise ServiceError(f"no API key with prefix {prefix!r}")
    if len(rows) > 1:
        raise ServiceError(f"key prefix {prefix!r} matches several keys; give more of it")
    return rows[0]


def api_key_rows() -> list[ApiKey]:
    """Every key, newest first (list_api_keys, the admin)."""
    return list(ApiKey.objects.select_related("group", "stream").order_by("-created_at", "-id"))


def key_is_active(key: ApiKey, now: datetime | None = None) -> bool:
    now = now or timezone.now()
    return key.revoked_at is None and (key.expires_at is None or key.expires_at > now)


def _key_event(kind: str, key: ApiKey, actor: str, **detail: object) -> None:
    stream_id = key.stream_id or (key.group.stream_id if key.group is not None else None)
    Event.objects.create(kind=kind, group_id=key.group_id, stream_id=stream_id, actor=actor,
                         detail={"prefix": key.prefix, "scope": key.scope, **detail})
    log.info("%s %s… by %s", kind, key.prefix, actor,
             extra={"event": kind, "prefix": key.prefix, "scope": key.scope})


def revoke_api_key(key: ApiKey | str, *, actor: str = "operator") -> ApiKey:
    """Revoke at once: every worker refuses the key within KEY_CACHE_SECONDS. Idempotent."""
    key_id = (find_api_key(key) if isinstance(key, str) else key).pk
    with transaction.atomic():
        row = ApiKey.objects.select_for_update(of=("self",)).select_related("group").get(pk=key_id)
        if row.revoked_at is None:
            row.revoked_at = timezone.now()
            row.save(update_fields=["revoked_at"])
            _key_event("api_key_revoked", row, actor)
    clear_key_cache()  # this worker at once; the others within KEY_CACHE_SECONDS
    return row


def rotate_api_key(key: ApiKey | str, *, grace_seconds: int = 0, actor: str = "operator") -> tuple[str, ApiKey]:
    """A new key with the same scope; the old one stays valid for `grace_seconds` (0: revoked
    now). Returns (the new raw key, the old key's row)."""
    _check_int("grace seconds", grace_seconds, 0, MAX_GRACE_SECONDS)
    key_id = (find_api_key(key) if isinstance(key, str) else key).pk
    with transaction.atomic():
        old = ApiKey.objects.select_for_update(of=("self",)).select_related("group").get(pk=key_id)
        now = timezone.now()
        if not key_is_active(old, now) or old.expires_at is not None:
            raise ServiceError(f"API key {old.prefix}… is revoked or already being rotated")
        raw, new = _new_key(name=old.name, group_id=old.group_id, stream_id=old.stream_id, scope=old.scope)
        if grace_seconds:
            old.expires_at = now + timedelta(seconds=grace_seconds)
            old.save(update_fields=["expires_at"])
        else:
            old.revoked_at = now
            old.save(update_fields=["revoked_at"])
        _key_event("api_key_rotated", old, actor, newPrefix=new.prefix, graceSeconds=grace_seconds)
    clear_key_cache()
    return raw, old


# A lookup whose leader was dropped before it had the answer: its waiters look up again.
_ABANDONED_LOOKUP = Exception("the key lookup's leader was dropped")


def resolve_api_key(raw: str) -> KeyScope | None:
    """The scope of a valid key, or None; the check that sits on every request."""
    if not raw or len(raw) > MAX_KEY_LENGTH:
        return None
    digest = _hash(raw)
    known, scope = _cached_key(digest)
    if known:
        return scope
    # One lookup per key at a time in this process: when the cached entry expires, a gevent
    # worker may hold hundreds of requests of that key (a join storm with a connection per
    # member), and each would query and queue for one of the worker's two connections. The
    # others wait for that lookup and share its outcome, its failure too: with the database
    # down, a lock here made them fail one after another, each after its own wait (issue 27.4).
    with _flights_guard:
        flight = _flights.get(digest)
        leader = flight is None
        if flight is None:
            flight = _flights[digest] = _KeyFlight()
    if not leader:
        waiting.wait(flight.done)
        if flight.error is _ABANDONED_LOOKUP:
            return resolve_api_key(raw)  # its leader was dropped before the answer: look up again
        if flight.error is not None:
            raise flight.error
        return flight.scope
    try:
        scope = _load_key(digest)
    except Exception as exc:
        flight.error = exc
        raise
    except BaseException:
        # The leader's request was dropped (the request deadline, issue 27.4): its waiters
        # are not, and look up again instead of failing with the leader's deadline.
        flight.error = _ABANDONED_LOOKUP
        raise
    else:
        flight.scope = scope
        now = time.monotonic()  # fresh from the answer, however long the lookup took
        if scope is None:
            _key_cache.pop(digest, None)
            if len(_unknown_keys) >= KEY_CACHE_MAX:
                _unknown_keys.clear()
            _unknown_keys[digest] = now + NEGATIVE_CACHE_SECONDS
        else:
            if len(_key_cache) >= KEY_CACHE_MAX:
                _key_cache.clear()
            _key_cache[digest] = (now + KEY_CACHE_SECONDS, scope)
    finally:
        with _flights_guard:
            _flights.pop(digest, None)  # later requests find the cache (or look up afresh)
        flight.done.set()
    dbpool.release()  # a request may wait long after this (the group's gate, a shared read)
    return scope


def cached_api_key(raw: str) -> tuple[bool, KeyScope | None]:
    """(True, scope or None) when this key is answered without the database (a cached key, a
    key cached as unknown, or one no key can be), else (False, None): resolve_api_key queries."""
    if not raw or len(raw) > MAX_KEY_LENGTH:
        return True, None
    return _cached_key(_hash(raw))


def key_lookup_in_flight(raw: str) -> bool:
    """Another request of this process is looking this key up now: resolve_api_key shares that
    lookup's answer and sends no query of its own (a first burst of one key after a start)."""
    if not raw or len(raw) > MAX_KEY_LENGTH:
        return False
    with _flights_guard:
        return _hash(raw) in _flights


def recently_valid_key(raw: str) -> bool:
    """This worker resolved this key to a scope before, and its cache entry has merely expired
    (an active member's key, once a second): not a guess, whatever its address did."""
    return bool(raw) and len(raw) <= MAX_KEY_LENGTH and _hash(raw) in _key_cache


def _cached_key(digest: str) -> tuple[bool, KeyScope | None]:
    """(True, scope or None) when the caches answer for this key now, else (False, None)."""
    now = time.monotonic()
    hit = _key_cache.get(digest)
    if hit is not None and hit[0] > now:
        scope = hit[1]
        return True, None if scope.expires_at is not None and scope.expires_at <= time.time() else scope
    return _unknown_keys.get(digest, 0.0) > now, None


def _load_key(digest: str) -> KeyScope | None:
    wall = timezone.now()
    # key_hash is unique: no ORDER BY, and only the columns the scope needs.
    rows = (
        ApiKey.objects.filter(key_hash=digest, revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=wall))
        .values_list("pk", "scope", "expires_at", "last_used_at", "group__name", "group__stream__name",
                     "stream__name")[:1]
    )
    row = next(iter(rows), None)
    if row is None:
        return None
    pk, role, expires_at, last_used_at, group, group_stream, stream = row
    stale = wall - LAST_USED_EVERY
    if last_used_at is None or last_used_at <= stale:
        # Compare-and-set: of all workers refreshing this key, one writes per minute.
        ApiKey.objects.filter(pk=pk).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lte=stale)
        ).update(last_used_at=wall)
    expires = expires_at.timestamp() if expires_at else None
    return KeyScope(pk, group, group_stream or stream, role, expires)


def clear_key_cache() -> None:
    _key_cache.clear()
    _unknown_keys.clear()


# --- group configuration (admin, CLI) -------------------------------------------------------

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
        validate_group_config(**{**current, **fields})
        changed = {f: v for f, v in fields.items() if current[f] != v}
        if not changed:
            return group
        update_group_settings(group, changed)  # raises metadataEpoch (under the row lock)
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


# --- group pause (§11) ------------------------------------------------------------------------
def pause_group(name: str, /, *, actor: str, now: datetime | None = None) -> bool:
    """§11: pause a group: members finish what they hold, then read nothing, keeping their
    shards and heartbeats. False when it was paused already (nothing changes)."""
    return _pause_or_resume(name, engine.s11_pause, actor, now)


def resume_group(name: str, /, *, actor: str, now: datetime | None = None) -> bool:
    """§11: resume a paused group. False when it was not paused (nothing changes)."""
    return _pause_or_resume(name, engine.s11_resume, actor, now)


def _pause_or_resume(
    name: str, rule: Callable[[GroupState, datetime, str], bool], actor: str, now: datetime | None
) -> bool:
    now = now or timezone.now()
    with transaction.atomic():
        group = lock_group(name)
        if group is None:
            raise ServiceError(f"group {name!r} does not exist")
        state, loaded = load_state(group)
        changed = rule(state, now, actor)
        if changed:
            # A locked write: it raises the group's state_version, so every process's steady
            # path (assignments.fastpath) sees the pause on its next heartbeat.
            save_state(state, loaded, now, actor=actor)
    return changed


def temporarily_left_note(group: Group, away: list[tuple[str, str | None, datetime | None]],
                          now: datetime) -> str:
    """How a refusal names static members that left temporarily (§9) and still hold their
    shards: each member id with its instance id and when it expires, and how to remove them
    now (issue 24.5). `away`: (member id, instance id, last heartbeat)."""
    def expires(last: datetime | None) -> str:
        if last is None:
            return "expires at the next sweep"
        left = group.session_timeout_ms / 1000 - (now - last).total_seconds()
        return f"expires in {max(0, round(left))} s"

    names = ", ".join(f"{mid} (instance {iid}, {expires(last)})" for mid, iid, last in away[:5])
    more = f" and {len(away) - 5} more" if len(away) > 5 else ""
    return (
        f"static members that left temporarily and keep their shards until they expire ({names}{more}):"
        f" wait, or remove them now with manage.py remove_member {group.name} MEMBER_ID"
    )
