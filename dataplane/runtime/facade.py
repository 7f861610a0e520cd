"""The runtime façade: builds the parts around one shard table and is the seam.

The membership driver (consumer.py) feeds it the machine's decisions through :meth:`grant`,
:meth:`revoke` and :meth:`abort`, and reads :meth:`in_flight` / :meth:`outstanding`,
:meth:`drained_shards` and :meth:`pop_lost`; tests and the benchmark drive it directly.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from .. import scripts
from ..connections import NET_ERRORS, redis_client
from ..errors import RedisPermissionError, RedisUnavailableError, is_noperm
from ..membership import Grant
from ..message import Message
from ..routing import DEFAULT_KEY_PREFIX, ShardKeys
from .acker import Acker, Fenced
from .async_workers import AsyncWorkers
from .capabilities import detect_ack_mode
from .config import RuntimeConfig
from .reader import Reader
from .recovery import Recovery
from .retry import Retry
from .shard_table import ShardStatus, ShardTable, StartShard, StopShard
from .workers import Dispatcher, ThreadWorkers, Workers

Handler = Callable[[Message], Any] | Callable[[Message], Awaitable[Any]]
BatchHandler = Callable[[list[Message]], Any] | Callable[[list[Message]], Awaitable[Any]]


def is_async_handler(handler: Callable[..., Any]) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 - an object with async __call__
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


class Runtime:
    """The consumer runtime on Redis for one member: fenced reads, recovery, lanes that keep
    per-key order, retries, DLQ and fenced ACKs. Driven through the seam (grant, revoke, abort,
    in_flight); ``Consumer`` drives it from the heartbeat answers."""

    def __init__(
        self,
        redis_url: str,
        group: str,
        consumer: str,
        handler: Handler | BatchHandler,
        config: RuntimeConfig | None = None,
        *,
        cluster: bool = False,
        socket_timeout: float = 5.0,
        batch: bool = False,
        metrics: Any = None,
    ) -> None:
        """``batch``: ``handler`` is a batch handler (a list of one shard's messages);
        ``metrics``: a ``dataplane.metrics.Metrics`` (None: no counting anywhere)."""
        self.group = group
        self.consumer = consumer
        self.cfg = cfg = config or RuntimeConfig()
        cfg.validate()
        self.cluster = cluster
        self.is_async = is_async_handler(handler)
        if metrics is not None:
            handler = metrics.wrap(handler, batch=batch)  # timed and counted per shard
        lanes = cfg.max_concurrency if self.is_async else cfg.workers
        self.max_in_flight = cfg.max_in_flight or lanes * cfg.batch_size * 4
        # Commands (ACKs, scripts, setup): a bounded, short retry; they are all idempotent.
        self.client = redis_client(redis_url, cluster=cluster, socket_timeout=socket_timeout)
        # Reads: the socket timeout sits well above BLOCK so a quiet stream is not mistaken
        # for a dead connection, and no automatic retry: after a failed read we re-read our
        # own PEL instead.
        self.read_client = redis_client(
            redis_url,
            cluster=cluster,
            socket_timeout=cfg.block_ms / 1000 + max(socket_timeout, 2.0),
            retries=0,
        )
        self._stopping = threading.Event()
        self.table = ShardTable(self.max_in_flight)
        self.changed = self.table.changed  # set when in-flight drops or drained/lost change
        self.fenced = Fenced(self.client, group, self.table, self._stopping)
        self.acker = Acker(self.fenced, self.table, self._stopping, cluster=cluster)
        retry = Retry(cfg, self.fenced, metrics)
        ack_before = cfg.ack == "before"
        parts = (lanes, retry, self.acker, self.fenced, self._stopping)
        self.workers: Workers = (
            AsyncWorkers(handler, *parts, ack_before=ack_before, batch=batch)
            if self.is_async
            else ThreadWorkers(handler, *parts, ack_before=ack_before, batch=batch)
        )
        dispatcher = Dispatcher(cfg.key_field, self.table, self.workers, self.acker, group)
        recovery = Recovery(
            self.client, group, consumer, cfg, self.table, dispatcher, self._stopping
        )
        self.reader = Reader(
            self.client, self.read_client, group, consumer, cfg, self.table, recovery,
            dispatcher, self._stopping, cluster=cluster,
        )  # fmt: skip
        self.reader.metrics = metrics
        if metrics is not None:
            metrics.in_flight.set_function(lambda: self.table.total_in_flight)
        self._started = False

    @property
    def redis_ok(self) -> bool:
        """False while the reader's last turn failed on a Redis connection error."""
        return self.reader.redis_ok

    @property
    def fatal(self) -> BaseException | None:
        """The first error no retry heals (:class:`RedisPermissionError`), or None: the
        Consumer leaves and raises it."""
        return self.table.fatal

    @property
    def ack_mode(self) -> str:
        return self.fenced.ack_mode

    @property
    def read_deadline(self) -> float:
        """The session lease (time.monotonic() seconds), kept by the Consumer: send time of
        the last accepted heartbeat + session timeout. Past it the coordinator may have expired
        us and handed our shards on, so the reader neither reads nor claims (the fenced read
        refuses them in Redis in any case). inf: no lease (direct use)."""
        return self.reader.read_deadline

    @read_deadline.setter
    def read_deadline(self, value: float) -> None:
        self.reader.read_deadline = value

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Probe the server and load the scripts, then start the threads. Raises
        :class:`RedisUnavailableError` when Redis cannot be reached."""
        if self._started:
            return
        try:
            self.fenced.ack_mode = detect_ack_mode(self.client)
            for s in scripts.ALL:
                s.ensure_loaded(self.client)
        except NET_ERRORS as exc:
            raise RedisUnavailableError(f"Redis is unreachable: {exc}") from exc
        except Exception as exc:
            if is_noperm(exc):
                raise RedisPermissionError("load the library's scripts", exc) from exc
            raise
        self._started = True
        self.workers.start()
        self.acker.start()
        self.reader.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop reading, let workers finish what they hold, flush ACKs, close connections."""
        if self._started:
            self._stopping.set()
            self.reader.wake_up()
            deadline = time.monotonic() + timeout
            self.reader.thread.join(max(0.0, deadline - time.monotonic()))
            self.workers.stop(max(0.0, deadline - time.monotonic()))
            self.acker.stop(max(0.0, deadline - time.monotonic()))
            if not self.reader.thread.is_alive():
                self.reader.close()
        for c in (self.read_client, self.client):
            with contextlib.suppress(Exception):
                c.close()

    # ---- the seam: decisions of the membership machine --------------------------------------

    def grant(self, grant: Grant) -> None:
        """Start a shard: raise its fence token, create the group, recover, then read."""
        self.table.enqueue(StartShard(grant))
        self.reader.wake_up()

    def revoke(self, shard: str) -> None:
        """C1: no new reads; the message in progress finishes and is ACKed, queued ones are
        left pending for the next owner; outstanding() reaches 0 when that is done."""
        self.table.enqueue(StopShard(shard, ShardStatus.REVOKING))
        self.reader.wake_up()

    def abort(self, shard: str) -> None:
        """C4: no new reads and no more ACKs."""
        self.table.enqueue(StopShard(shard, ShardStatus.ABORTED))
        self.reader.wake_up()

    def set_paused(self, paused: bool) -> None:
        """§11: while paused the reader makes no new reads and runs no pending recovery on any
        shard; what is in flight is still handled and ACKed, and control ops (grants, revokes)
        still apply, so a revoked shard reaches in-flight 0 and a granted one is set up."""
        if self.reader.paused != paused:
            self.reader.paused = paused
            self.reader.wake_up()  # interrupts a blocking wait at once

    @property
    def paused(self) -> bool:
        return self.reader.paused

    def in_flight(self, shard: str) -> int:
        """Messages of the shard read but not finished (ACKed or dropped), plus one while a
        read that covers it is outstanding: entries that read delivers land in our PEL."""
        return self.table.in_flight(shard)

    def queued_ops(self, shard: str) -> int:
        """Control ops (grant, revoke, abort) of the shard not yet applied by the reader."""
        return self.table.queued_ops(shard)

    def outstanding(self, shard: str) -> int:
        """:meth:`in_flight` plus :meth:`queued_ops`: what must be 0 before a revoked shard is
        REVOKED. A queued grant counts: reporting REVOKED before it ran would let the next
        owner raise the fence first, and our late start would then find us stale."""
        return self.table.in_flight(shard) + self.table.queued_ops(shard)

    def wait_idle_reads(self, shards: Iterable[str], timeout: float) -> bool:
        """Wait until no outstanding read or queued control op covers any of ``shards``."""
        deadline = time.monotonic() + timeout
        wanted = set(shards)
        while not self.table.reads_idle(wanted):
            if time.monotonic() >= deadline:
                return False
            self.reader.wake_up()
            self.changed.wait(0.02)
            self.changed.clear()
        return True

    def forget(self, shard: str) -> None:
        """Drop a finished revoked/aborted shard from the books."""
        self.table.forget(shard)

    def status(self, shard: str) -> ShardStatus | None:
        return self.table.status(shard)

    def drained_shards(self) -> set[str]:
        """Shards sealed and read to the end with nothing pending (a state, not consumed)."""
        return self.table.drained_shards()

    def pop_lost(self) -> set[str]:
        """Shards whose fence token another grant took since the last call (each once)."""
        return self.table.pop_lost()

    def idempotency_marker(self, msg: Message, marker: str, ttl_ms: int) -> bool:
        """SET NX PX a marker in the message's shard slot. True the first time (go ahead),
        False when it already exists (a duplicate within ``ttl_ms``)."""
        st = self.table.get(msg.shard)
        prefix = st.grant.key_prefix if st else DEFAULT_KEY_PREFIX
        key = ShardKeys(msg.shard, prefix).idem(self.group, marker)
        try:
            return bool(self.client.set(key, "1", nx=True, px=ttl_ms))
        except Exception as exc:
            if is_noperm(exc):
                self.table.fail(RedisPermissionError("set idempotency markers", exc))
            raise
