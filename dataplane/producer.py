"""Producer: routes a key to its shard of the current write version and appends to it.

Appends go through one Lua script per shard batch that refuses a sealed shard (the seal
marker lives in the shard's slot), so nothing lands in version v after its seal; on refusal
the producer refreshes routing from the coordinator and retries on the new version (§6.2).
Publishing is at-least-once: a retry after a lost reply can append twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from . import scripts
from .backoff import Backoff
from .connections import redis_client
from .routing import HASH_ALGORITHM, ShardVersion, document_versions, hash64, shard_index
from .transport import Transport

log = logging.getLogger(__name__)


class Sent(NamedTuple):
    """Where :meth:`Producer.send` appended a message: the shard id and the entry id."""

    shard: str
    id: str


class ShardSealedError(RuntimeError):
    """Routing kept naming sealed shards for longer than the producer's retry budget."""


class Route(NamedTuple):
    shard: str
    stream: str
    seal: str


class RoutingTable:
    """The write version of one stream, from ``GET /api/v1/streams/{stream}/routing``."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        if doc.get("hash", HASH_ALGORITHM) != HASH_ALGORITHM:
            raise ValueError(f"unsupported hash {doc.get('hash')!r}")
        self.stream: str = doc["stream"]
        self.write_version: int = int(doc["writeVersion"])
        self.metadata_epoch: int = int(doc.get("metadataEpoch") or 0)
        # §6: the version, not a list of its shards; routes are derived (dataplane.routing).
        version = next(v for v in document_versions(doc) if v.version == self.write_version)
        self.version: ShardVersion = version
        self.shard_count: int = version.shard_count

    def route(self, key: str) -> Route:
        return self.route_of(shard_index(hash64(key), self.shard_count))

    def route_of(self, index: int) -> Route:
        keys = self.version.keys(index)
        return Route(keys.shard_id, keys.stream, keys.sealed)


class Producer:
    """Appends messages to a stream's shards, routed by key (``hash64``) on the routing the
    coordinator publishes; seal-aware (a sealed shard's batch is rerouted after a routing
    refresh) and batched (one script call per shard and batch). Use as a context manager."""

    def __init__(
        self,
        coordinator_url: str,
        stream: str,
        api_key: str | None,
        redis_url: str = "redis://127.0.0.1:6379/0",
        *,
        key_field: str = "key",
        maxlen: int | None = None,
        cluster: bool = False,
        retry_timeout_s: float = 30.0,
        routing_ttl_s: float = 30.0,
        transport: Transport | None = None,
        client: Any = None,
        tracing: bool = False,
    ) -> None:
        self.stream = stream
        # OpenTelemetry (optional extra): imported only when asked for.
        self._trace_fields: Callable[[], dict[str, str]] | None = None
        if tracing:
            from .tracing import current_context_fields

            self._trace_fields = current_context_fields
        self.key_field = key_field
        self.maxlen = maxlen or 0
        self.retry_timeout_s = retry_timeout_s
        self.routing_ttl_s = routing_ttl_s
        self.transport = transport or Transport(coordinator_url, api_key)
        self.client = client if client is not None else redis_client(redis_url, cluster=cluster)
        self._table: RoutingTable | None = None
        self._fetched_at = 0.0
        self._lock = threading.Lock()
        self._loaded = False

    def close(self) -> None:
        self.transport.close()
        self.client.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- routing -----------------------------------------------------------------------

    def routing(self, refresh: bool = False) -> RoutingTable:
        """The cached routing table; refreshed when told, or after routing_ttl_s."""
        with self._lock:
            stale = time.monotonic() - self._fetched_at > self.routing_ttl_s
            if self._table is None or refresh or stale:
                table = RoutingTable(self.transport.routing(self.stream))
                if self._table is None or table.write_version != self._table.write_version:
                    log.info("routing %s: write version %s", self.stream, table.write_version)
                self._table = table
                self._fetched_at = time.monotonic()
            return self._table

    def route(self, key: str) -> Route:
        return self.routing().route(key)

    # ---- sending -----------------------------------------------------------------------

    def send(self, key: str, fields: Mapping[str, Any]) -> Sent:
        return self.send_many([(key, fields)])[0]

    def send_many(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> list[Sent]:
        """Append many messages: one script call per shard, all in one pipeline."""
        if not self._loaded:
            scripts.append.ensure_loaded(self.client)
            self._loaded = True
        kf = self.key_field
        todo: list[tuple[int, str, list[Any]]] = []
        extra: list[Any] = []
        if self._trace_fields is not None:  # the caller's trace context, into every message
            for f, v in self._trace_fields().items():
                extra += (f, v)
        for i, (key, fields) in enumerate(items):
            flat: list[Any] = [kf, key]
            for f, v in fields.items():
                if f != kf:
                    flat += (f, v)
            if extra and "traceparent" not in fields:  # a context the caller set wins
                flat += extra
            todo.append((i, key, flat))
        out: list[Sent | None] = [None] * len(todo)
        deadline = time.monotonic() + self.retry_timeout_s
        refresh = False
        backoff = Backoff(0.05, 1.0, jitter=False)
        while todo:
            table = self.routing(refresh=refresh)
            todo = self._append(table, todo, out)
            if not todo:
                break
            if time.monotonic() > deadline:
                raise ShardSealedError(
                    f"{len(todo)} messages still route to sealed shards of {self.stream} "
                    f"(write version {table.write_version})"
                )
            if refresh:  # refreshed already and still sealed: the reshard is in progress
                backoff.wait()
            refresh = True
        return out  # type: ignore[return-value]

    def _append(
        self,
        table: RoutingTable,
        todo: list[tuple[int, str, list[Any]]],
        out: list[Sent | None],
    ) -> list[tuple[int, str, list[Any]]]:
        by_shard: dict[int, list[tuple[int, str, list[Any]]]] = {}
        n = table.shard_count
        for item in todo:
            by_shard.setdefault(shard_index(hash64(item[1]), n), []).append(item)
        order: list[tuple[Route, list[tuple[int, str, list[Any]]]]] = []
        calls: list[tuple[scripts.Lua, list[str], list[Any]]] = []
        for idx, batch in by_shard.items():
            route = table.route_of(idx)
            args: list[Any] = [self.maxlen, len(batch)]
            for _i, _k, flat in batch:
                args.append(len(flat))
                args.extend(flat)
            calls.append((scripts.append, [route.stream, route.seal], args))
            order.append((route, batch))
        results = scripts.run_many(self.client, calls)
        refused: list[tuple[int, str, list[Any]]] = []
        for (route, batch), res in zip(order, results, strict=True):
            if isinstance(res, Exception):
                raise res
            if res is None:  # sealed
                refused.extend(batch)
                continue
            for (i, _k, _f), entry_id in zip(batch, res, strict=True):
                out[i] = Sent(route.shard, entry_id)
        refused.sort(key=lambda t: t[0])  # keep the caller's order within a key
        return refused


__all__ = ["Producer", "Route", "RoutingTable", "Sent", "ShardSealedError"]
