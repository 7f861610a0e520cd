"""Backlog, lag, pending and DLQ length per group and shard, read-only (PROTOCOL.md §8, §10).

The one place the coordinator reads shard streams. Per group and live shard it pipelines
`XINFO GROUPS <shard>`, `XLEN <shard>` and `XLEN <shard's DLQ>`; on a Redis Cluster the
pipeline is split per node by redis-py, so one refresh costs one round trip per node. The
result is cached per process for `SHARD_STATS_CACHE_SECONDS` (≤ 2 s), so a busy admin page
or a Prometheus scraper costs Redis one round trip per node per period, whoever asks; a
slightly older result is served while a background thread refreshes it (`shard_stats`).

Figures:

* ``lag``: entries not yet delivered to the group. Redis ≥ 7.0 reports it in XINFO GROUPS;
  it reports null where it cannot tell (an XDEL after the group's last-delivered ID, an
  XTRIM past it, an XGROUP SETID without ENTRIESREAD). Fallback, in a second pipelined round
  trip for those shards only: count the entries after the last-delivered ID with
  ``XRANGE <shard> (<last-delivered> + COUNT <limit>``. Below the limit the count is exact;
  at the limit ``lag`` is that lower bound and ``lagExact`` is false.
  Redis 7.0 also over-reports after an XTRIM past the last-delivered ID (it still counts the
  trimmed, never-delivered entries); the figure is capped at XLEN, which is then exact.
* A shard whose stream exists but has no consumer group for this group yet (nobody has read
  it) counts its whole ``XLEN`` as lag; a missing stream counts 0.
* ``pending``: delivered and not ACKed (XINFO GROUPS ``pending``); ``lastDeliveredId`` and
  ``entriesRead`` as Redis reports them; ``dlqLength``: XLEN of the group's DLQ stream of
  the shard, named by the data plane (`dataplane.routing.ShardKeys.dlq`).

Redis that cannot be reached (short socket timeouts, no retries) gives every figure null and
``error`` says why; the failure is cached like a result. Heartbeats never call this module.
Only read-only commands: XINFO GROUPS, XLEN, XRANGE.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from coordinator_project.process_state import PROCESS, ProcessCache
from dataplane.routing import ShardKeys


@dataclass(frozen=True)
class ShardStats:
    shard_id: str
    length: int | None = None  # XLEN of the shard stream
    lag: int | None = None
    lag_exact: bool = True  # False: `lag` is the XRANGE fallback's limit, a lower bound
    lag_source: str = ""  # xinfo, xrange (fallback), no-group, no-stream
    pending: int | None = None
    last_delivered_id: str | None = None
    entries_read: int | None = None
    dlq_length: int | None = None


@dataclass(frozen=True)
class GroupStats:
    group: str
    ok: bool
    error: str | None
    as_of: datetime
    shards: dict[str, ShardStats] = field(default_factory=dict)

    def shard(self, shard_id: str) -> ShardStats:
        return self.shards.get(shard_id) or ShardStats(shard_id)

    def _total(self, attr: str) -> int | None:
        if not self.ok:
            return None
        return sum(getattr(s, attr) or 0 for s in self.shards.values())

    # Cached: pages and scrapes ask for the totals of thousands of shards several times.
    @cached_property
    def lag(self) -> int | None:
        return self._total("lag")

    @cached_property
    def pending(self) -> int | None:
        return self._total("pending")

    @cached_property
    def dlq(self) -> int | None:
        return self._total("dlq_length")

    def redis_doc(self) -> dict[str, Any]:
        """The describe API's ``redis`` object."""
        return {"ok": self.ok, "error": self.error, "asOf": self.as_of.isoformat()}


# --- reading (no Django, no cache): testable against any client --------------------------------
def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def group_entry(reply: Any, group: str) -> dict[str, Any] | None:
    """Our group's row of an XINFO GROUPS reply (redis-py gives a list of dicts)."""
    if isinstance(reply, Exception) or not isinstance(reply, list):
        return None
    for row in reply:
        entry = {_text(k): _text(v) for k, v in row.items()}
        if entry.get("name") == group:
            return entry
    return None


def read_shard_stats(
    client: redis.Redis | RedisCluster, group: str, shard_ids: Sequence[str], prefix: str,
    *, xrange_limit: int = 1000,
) -> dict[str, ShardStats]:
    """Pipelined read-only figures of `group` on each shard. Raises redis errors (caller decides)."""
    keys = [ShardKeys(s, prefix) for s in shard_ids]
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.xinfo_groups(k.stream)
        pipe.xlen(k.stream)
        pipe.xlen(k.dlq(group))
    replies = pipe.execute(raise_on_error=False)
    for reply in replies:  # a connection failure is an error of the whole read
        if isinstance(reply, redis.ConnectionError | redis.TimeoutError):
            raise reply
    out: dict[str, ShardStats] = {}
    need_count: list[tuple[int, str]] = []  # (index, last-delivered id) of null-lag shards
    for i in range(len(keys)):
        info, length, dlq = replies[3 * i: 3 * i + 3]
        length = length if isinstance(length, int) else None
        dlq = dlq if isinstance(dlq, int) else None
        entry = group_entry(info, group)
        sid = shard_ids[i]
        if entry is None:
            # No stream (XINFO errors with "no such key") or no consumer group yet: nothing
            # was delivered to the group, so everything in the stream is lag.
            source = "no-stream" if isinstance(info, Exception) else "no-group"
            out[sid] = ShardStats(sid, length, length, True, source, 0, None, None, dlq)
            continue
        lag = entry.get("lag")
        last_id = entry.get("last-delivered-id")
        stats = ShardStats(
            sid, length, lag, True, "xinfo", entry.get("pending"), last_id, entry.get("entries-read"), dlq,
        )
        if lag is not None and length is not None and lag > length:
            # Redis 7.0 still counts entries trimmed away before delivery (entries-added −
            # entries-read); whatever is left after the last-delivered ID is at most XLEN,
            # and then all of it is undelivered.
            stats = replace(stats, lag=length)
        if lag is None and length == 0:
            stats = replace(stats, lag=0)
        elif lag is None:
            need_count.append((i, last_id or "0-0"))
        out[sid] = stats
    if need_count:
        pipe = client.pipeline(transaction=False)
        for i, last_id in need_count:
            pipe.xrange(keys[i].stream, min=f"({last_id}", max="+", count=xrange_limit)
        for (i, _), reply in zip(need_count, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, Exception):
                continue  # lag stays null for this shard; the rest stand
            sid = shard_ids[i]
            out[sid] = replace(out[sid], lag=len(reply), lag_exact=len(reply) < xrange_limit, lag_source="xrange")
    return out


# --- the cached shell ---------------------------------------------------------------------------
_clients: ProcessCache[tuple[str, bool], redis.Redis | RedisCluster] = PROCESS.own(
    "shard figure Redis clients", ProcessCache(),
    "key: (STREAM_REDIS_URL, cluster) -> client; bound: one per URL; invalidated: a failed read"
    " drops its client; N hosts: a connection, no data.",
    reset=lambda: clear_cache(), close=lambda: clear_cache(),
)
_cache: ProcessCache[tuple[str, str, tuple[str, ...]], tuple[float, GroupStats]] = PROCESS.own(
    "shard figures", ProcessCache(),
    "key: (group, key prefix, shard ids) -> (read at, figures); bound: 4,096, then emptied;"
    " invalidated: age (SHARD_STATS_CACHE_SECONDS, served stale up to"
    " SHARD_STATS_STALE_SECONDS), forget() after a position reset here; N hosts: read-only"
    " figures for pages, each host reads Redis itself.",
    reset=lambda: clear_cache(),
)
_lock = threading.Lock()


def stream_client() -> redis.Redis | RedisCluster:
    """The client for the shard streams (STREAM_REDIS_URL, a Cluster if STREAM_REDIS_CLUSTER)."""
    return _client(settings.STREAM_REDIS_URL, settings.STREAM_REDIS_CLUSTER)


def _client(url: str, cluster: bool) -> redis.Redis | RedisCluster:
    key = (url, cluster)
    client = _clients.get(key)
    if client is None:
        timeout = settings.SHARD_STATS_SOCKET_TIMEOUT
        # Short timeouts and no retries: a page must not hang on a Redis that is away.
        options: dict[str, Any] = dict(
            socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
        )
        # A cluster client connects now: a failure is not cached.
        client = RedisCluster.from_url(url, **options) if cluster else redis.Redis.from_url(url, **options)
        _clients[key] = client
    return client


def forget(group: str) -> None:
    """Drop `group`'s cached figures (after a position reset changed them)."""
    with _lock:
        for key in [k for k in _cache if k[0] == group]:
            del _cache[key]


def clear_cache() -> None:
    with _lock:
        _cache.clear()
        for client in _clients.values():
            client.close()
        _clients.clear()


def _reason(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def _read(key: tuple[str, str, tuple[str, ...]]) -> GroupStats:
    """Read and cache one group's figures (the caller holds `_lock`)."""
    group, prefix, shard_ids = key
    url, cluster = settings.STREAM_REDIS_URL, settings.STREAM_REDIS_CLUSTER
    as_of = datetime.now(UTC)
    try:
        shards = read_shard_stats(
            _client(url, cluster), group, shard_ids, prefix, xrange_limit=settings.SHARD_STATS_XRANGE_LIMIT
        )
        result = GroupStats(group, True, None, as_of, shards)
    except (redis.RedisError, OSError) as exc:
        broken = _clients.pop((url, cluster), None)
        if broken is not None:
            broken.close()
        result = GroupStats(group, False, _reason(exc), as_of, {})
    if len(_cache) > 4096:
        _cache.clear()
    _cache[key] = (time.monotonic(), result)
    return result


_refreshing: set[tuple[str, str, tuple[str, ...]]] = PROCESS.own(
    "shard figure refreshes", set(),
    "key: (group, key prefix, shard ids) being re-read in the background; bound: one per key;"
    " invalidated: the refresh's end; N hosts: each host refreshes its own figures.",
    reset=lambda: _forget_refreshes(),  # a refresh in flight ends as usual; its key may run again
)
_lock_refreshing = threading.Lock()


def _forget_refreshes() -> None:
    with _lock_refreshing:
        _refreshing.clear()


def _refresh_in_background(key: tuple[str, str, tuple[str, ...]]) -> None:
    with _lock_refreshing:
        if key in _refreshing:
            return
        _refreshing.add(key)

    def run() -> None:
        try:
            with _lock:
                _read(key)
        finally:
            with _lock_refreshing:
                _refreshing.discard(key)

    threading.Thread(target=run, name=f"shardstats-{key[0]}", daemon=True).start()



def shard_stats(group: str, prefix: str, shard_ids: Sequence[str], *, fresh: bool = False) -> GroupStats:
    """`group`'s figures on `shard_ids`.

    Younger than SHARD_STATS_CACHE_SECONDS: from the cache. Older, but by less than
    SHARD_STATS_STALE_SECONDS more: still from the cache, while one background thread reads
    them again (a page never waits for a 4,096-shard pipeline it asked for two seconds ago;
    `asOf` says how old they are). Older still, or `fresh`: read now.
    """
    key = (group, prefix, tuple(shard_ids))
    ttl = settings.SHARD_STATS_CACHE_SECONDS
    hit = _cache.get(key)
    if hit is not None and not fresh:
        age = time.monotonic() - hit[0]
        if age < ttl:
            return hit[1]
        if age < ttl + settings.SHARD_STATS_STALE_SECONDS:
            _refresh_in_background(key)
            return hit[1]
    # One reader per process at a time: concurrent requests for the same group wait for
    # the first one's answer instead of each sending the same pipeline.
    with _lock:
        hit = _cache.get(key)
        if hit is not None and not fresh and time.monotonic() - hit[0] < ttl:
            return hit[1]
        return _read(key)


@dataclass(frozen=True)
class DlqEntry:
    shard_id: str
    entry_id: str  # id in the DLQ stream (its time is when it was dead-lettered)
    original_id: str
    error: str
    deliveries: str
    key: str
    fields: dict[str, str]


def newest_dlq_entries(group: str, prefix: str, stats: GroupStats, limit: int = 10) -> tuple[list[DlqEntry], str | None]:
    """The newest DLQ entries of `group` over its shards with the longest DLQs (XREVRANGE,
    read-only; at most `limit` shards × `limit` entries). Returns (entries, error)."""
    shards = sorted((s for s in stats.shards.values() if s.dlq_length), key=lambda s: -(s.dlq_length or 0))[:limit]
    if not shards:
        return [], None
    try:
        pipe = stream_client().pipeline(transaction=False)
        for s in shards:
            pipe.xrevrange(ShardKeys(s.shard_id, prefix).dlq(group), count=limit)
        replies = pipe.execute()
    except (redis.RedisError, OSError) as exc:
        return [], _reason(exc)
    out = []
    for s, reply in zip(shards, replies, strict=True):
        for entry_id, raw in reply:
            fields = {_text(k): _text(v) for k, v in raw.items()}
            out.append(DlqEntry(
                shard_id=s.shard_id, entry_id=_text(entry_id), original_id=fields.pop("dlq:id", ""),
                error=fields.pop("dlq:error", ""), deliveries=fields.pop("dlq:deliveries", ""),
                key=fields.get("key", ""),
                fields={k: v for k, v in fields.items() if not k.startswith("dlq:")},
            ))
    out.sort(key=lambda e: tuple(int(p) for p in e.entry_id.split("-")), reverse=True)
    return out[:limit], None
