"""The consumer runtime on Redis (PROTOCOL.md §7): reads, recovers, dispatches, retries, ACKs.

It knows nothing of the coordinator. Its seam is :meth:`Runtime.grant`, :meth:`Runtime.revoke`,
:meth:`Runtime.abort` and :meth:`Runtime.in_flight`: the membership driver (consumer.py) feeds
it the machine's decisions, and tests and the benchmark drive it directly.

Threads and why:
- one reader thread per connection domain (the server, or each node of a cluster): it alone
  issues XREADGROUP, so recovery, re-reads after errors and new reads of a shard are dispatched
  in ID order;
- ``workers`` worker threads, each owning a queue: a key always maps to the same worker, so
  per-key order holds while different keys run in parallel; the reader hands each worker one
  list per shard and read (a batch), never one message per thread hop;
- one acker thread that drains whatever the workers finished and ACKs it per shard through
  the fenced ACK script, pipelined: ACK batching grows with load by itself.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from . import scripts
from .membership import Grant
from .message import Message
from .routing import ShardKeys

log = logging.getLogger(__name__)

Handler = Callable[[Message], Any]
_NET_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)

# Shard states as seen by the runtime.
STARTING = "STARTING"  # fence token + group creation pending
RECOVERING = "RECOVERING"  # re-dispatching pending entries before new reads
ACTIVE = "ACTIVE"
REVOKING = "REVOKING"  # no new reads; finish the message in progress, ACK, then done
ABORTED = "ABORTED"  # fenced: no new reads, no ACKs
LOST = "LOST"  # our fence token was overtaken: we are stale for this shard


def ack_mode_from_capabilities(command_info: Any, server_version: str | None = None) -> str:
    """Pick the ACK command: ``"XACKDEL"`` when the server has it (Redis >= 8.2), else ``"XACK"``.

    ``command_info`` is the reply of ``COMMAND INFO XACKDEL`` (``[None]`` when the server does
    not know the command; ``None`` when the question itself failed, e.g. a proxy that hides
    COMMAND); ``server_version`` is INFO's redis_version, the fallback.
    """
    if isinstance(command_info, list | tuple) and command_info:
        return "XACKDEL" if command_info[0] else "XACK"
    if isinstance(command_info, dict) and command_info:
        return "XACKDEL" if any(command_info.values()) else "XACK"
    if server_version:
        try:
            parts = tuple(int(p) for p in server_version.split(".")[:2])
        except ValueError:
            return "XACK"
        return "XACKDEL" if parts >= (8, 2) else "XACK"
    return "XACK"


def detect_ack_mode(client: Any) -> str:
    """Ask the server which ACK command it has (see :func:`ack_mode_from_capabilities`)."""
    info: Any = None
    version: str | None = None
    try:
        # "COMMAND INFO" as one word bypasses redis-py's reply parser, which chokes on [None].
        info = client.execute_command("COMMAND INFO", "XACKDEL")
    except Exception:
        info = None
    if not info:
        try:
            raw = client.info("server")
            if isinstance(raw, dict) and "redis_version" not in raw:  # cluster: per node
                raw = next(iter(raw.values()), {})
            version = raw.get("redis_version")
        except Exception:
            version = None
    return ack_mode_from_capabilities(info, version)


@dataclass(slots=True)
class RuntimeConfig:
    workers: int = 4
    batch_size: int = 100
    block_ms: int = 1000
    max_deliveries: int = 5
    key_field: str = "key"
    ack: str = "after"  # "after": ACK once the handler succeeded; "before": ACK, then run
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 5000
    max_in_flight: int = 0  # 0: workers * batch_size * 4
    claim_idle_ms: int = 60_000  # orphan sweep: claim others' entries idle this long
    sweep_interval_ms: int = 30_000
    drain_check_ms: int = 1000
    dlq_maxlen: int = 100_000


class ShardState:
    """Runtime view of one granted shard. Workers and the acker hold references to it, so a
    regrant (a new object) never mixes its counts with the old grant's."""

    __slots__ = (
        "claim_cursor",
        "grant",
        "in_flight",
        "keys",
        "last_id",
        "next_sweep",
        "phase",
        "status",
        "stream",
        "token",
    )

    def __init__(self, grant: Grant) -> None:
        self.grant = grant
        self.keys = ShardKeys(grant.shard, grant.key_prefix)
        self.stream = grant.redis_key
        self.token = grant.token
        self.status = STARTING
        self.in_flight = 0
        self.last_id = "0"  # the highest id dispatched: re-reads of our PEL start after it
        self.phase = "claim"  # recovery: "claim" others' entries, then "own" PEL
        self.claim_cursor = "0-0"
        self.next_sweep = 0.0

    @property
    def shard(self) -> str:
        return self.grant.shard

    @property
    def reading(self) -> bool:
        return self.status in (STARTING, RECOVERING, ACTIVE)


class Runtime:
    def __init__(
        self,
        redis_url: str,
        group: str,
        consumer: str,
        handler: Handler,
        config: RuntimeConfig | None = None,
        *,
        cluster: bool = False,
        socket_timeout: float = 5.0,
    ) -> None:
        self.group = group
        self.consumer = consumer
        self.handler = handler
        self.cfg = cfg = config or RuntimeConfig()
        if cfg.ack not in ("after", "before"):
            raise ValueError("ack must be 'after' or 'before'")
        if cfg.workers < 1 or cfg.batch_size < 1 or cfg.max_deliveries < 1:
            raise ValueError("workers, batch_size and max_deliveries must be >= 1")
        self.max_in_flight = cfg.max_in_flight or cfg.workers * cfg.batch_size * 4
        self.cluster = cluster
        # Commands (ACKs, scripts, setup): a bounded, short retry; they are all idempotent.
        retry = Retry(ExponentialBackoff(cap=1.0, base=0.05), 3)
        # Reads: the socket timeout sits well above BLOCK so a quiet stream is not mistaken
        # for a dead connection (redis-py 8 defaults would silently retry long BLOCK reads),
        # and no automatic retry: after a failed read we re-read our own PEL instead.
        read_timeout = cfg.block_ms / 1000 + max(socket_timeout, 2.0)
        common: dict[str, Any] = {"decode_responses": True, "socket_connect_timeout": 5.0}
        if cluster:
            from redis.cluster import RedisCluster

            self.client: Any = RedisCluster.from_url(
                redis_url, socket_timeout=socket_timeout, retry=retry, **common
            )
            self.read_client: Any = RedisCluster.from_url(
                redis_url,
                socket_timeout=read_timeout,
                retry=Retry(ExponentialBackoff(), 0),
                **common,
            )
        else:
            self.client = redis.Redis.from_url(
                redis_url, socket_timeout=socket_timeout, retry=retry, **common
            )
            self.read_client = redis.Redis.from_url(
                redis_url,
                socket_timeout=read_timeout,
                retry=Retry(ExponentialBackoff(), 0),
                single_connection_client=True,
                **common,
            )
        self.ack_mode = "XACK"

        self._lock = threading.Lock()
        self._capacity = threading.Condition(self._lock)
        self._total_in_flight = 0
        self._shards: dict[str, ShardState] = {}
        self._by_stream: dict[str, ShardState] = {}
        self._reading_now: frozenset[str] = frozenset()
        self._control: deque[tuple[str, Any]] = deque()
        self._queued: dict[str, int] = defaultdict(int)  # control ops not yet applied, per shard
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._drained: set[str] = set()
        self._lost: set[str] = set()
        self.changed = threading.Event()  # set when in-flight drops or drained/lost change

        self._queues: list[SimpleQueue[Any]] = [SimpleQueue() for _ in range(cfg.workers)]
        self._acks: SimpleQueue[Any] = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._reader_conn_id: int | None = None
        self._started = False
        # The session lease (time.monotonic() seconds), kept by the Consumer: send time of the
        # last accepted heartbeat + session timeout. Past it the coordinator may have expired
        # us and handed our shards on, so the reader neither reads nor claims: a process that
        # stalled (GC, VM pause, SIGSTOP) must not read its old shards again in the moment
        # between resuming and its heartbeat loop noticing. inf: no lease (direct use).
        self.read_deadline = float("inf")
        self.stats = {"handled": 0, "acked": 0, "failed": 0, "dlq": 0, "read_errors": 0}

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self.ack_mode = detect_ack_mode(self.client)
        for s in scripts.ALL:
            s.ensure_loaded(self.client)
        for i, q in enumerate(self._queues):
            self._spawn(f"dp-worker-{i}", self._worker_loop, q)
        self._spawn("dp-acker", self._acker_loop)
        self._spawn("dp-reader", self._reader_loop)

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop reading, let workers finish what they hold, flush ACKs, close connections."""
        if not self._started:
            return
        self._stopping.set()
        self._wake_reader()
        deadline = time.monotonic() + timeout
        reader = self._threads[-1]
        reader.join(max(0.0, deadline - time.monotonic()))
        for q in self._queues:
            q.put(None)
        for t in self._threads[:-2]:
            t.join(max(0.0, deadline - time.monotonic()))
        self._acks.put(None)
        self._threads[-2].join(max(0.0, deadline - time.monotonic()))
        for c in (self.read_client, self.client):
            with contextlib.suppress(Exception):
                c.close()

    # ---- the seam: decisions of the membership machine --------------------------------------

    def grant(self, grant: Grant) -> None:
        """Start a shard: raise its fence token, create the group, recover, then read."""
        with self._lock:
            self._queued[grant.shard] += 1
            self._control.append(("grant", grant))
        self._wake_reader()

    def revoke(self, shard: str) -> None:
        """C1: no new reads; the message in progress finishes and is ACKed, queued ones are
        left pending for the next owner; in_flight() reaches 0 when that is done."""
        self._stop_shard(shard, REVOKING)

    def abort(self, shard: str) -> None:
        """C4: no new reads and no more ACKs."""
        self._stop_shard(shard, ABORTED)

    def _stop_shard(self, shard: str, status: str) -> None:
        with self._lock:
            st = self._shards.get(shard)
            if st is not None and st.status not in (ABORTED, LOST):
                st.status = status
            self._drained.discard(shard)
            # A grant still queued for this shard must not start it after the stop.
            self._queued[shard] += 1
            self._control.append(("stop", (shard, status)))
        self._wake_reader()

    def in_flight(self, shard: str) -> int:
        """Messages of the shard read but not finished (ACKed or dropped), plus one while a
        read that includes it is outstanding: entries that read delivers land in our PEL."""
        with self._lock:
            st = self._shards.get(shard)
            n = st.in_flight if st is not None else 0
            # A queued grant is in flight too: reporting REVOKED before it ran would let the
            # next owner raise the fence first, and our late start would then find us stale.
            n += self._queued.get(shard, 0)
            return n + (1 if shard in self._reading_now else 0)

    def wait_idle_reads(self, shards: Iterable[str], timeout: float) -> bool:
        """Wait until no outstanding read or queued control op covers any of ``shards``."""
        deadline = time.monotonic() + timeout
        wanted = set(shards)
        while True:
            with self._lock:
                busy = wanted & self._reading_now or any(self._queued.get(s) for s in wanted)
            if not busy:
                return True
            if time.monotonic() >= deadline:
                return False
            self._wake_reader()
            self.changed.wait(0.02)
            self.changed.clear()

    def forget(self, shard: str) -> None:
        """Drop a finished revoked/aborted shard from the books."""
        with self._lock:
            st = self._shards.get(shard)
            if st is not None and not st.reading and st.in_flight == 0:
                del self._shards[shard]
                self._by_stream.pop(st.stream, None)

    def wait_idle(self, shards: Iterable[str], timeout: float) -> bool:
        """Wait (polling with a deadline) until none of ``shards`` has anything in flight."""
        deadline = time.monotonic() + timeout
        shards = list(shards)
        while True:
            if all(self.in_flight(s) == 0 for s in shards):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.changed.wait(min(remaining, 0.05))
            self.changed.clear()

    def status(self, shard: str) -> str | None:
        with self._lock:
            st = self._shards.get(shard)
            return st.status if st else None

    def take_drained(self) -> set[str]:
        with self._lock:
            return set(self._drained)

    def take_lost(self) -> set[str]:
        with self._lock:
            lost, self._lost = self._lost, set()
            return lost

    def idempotency_marker(self, msg: Message, marker: str, ttl_ms: int) -> bool:
        """SET NX PX a marker in the message's shard slot. True the first time (go ahead),
        False when it already exists (a duplicate within ``ttl_ms``)."""
        key = ShardKeys(msg.shard, self._prefix_of(msg.shard)).idem(self.group, marker)
        return bool(self.client.set(key, "1", nx=True, px=ttl_ms))

    def _prefix_of(self, shard: str) -> str:
        with self._lock:
            st = self._shards.get(shard)
        return st.grant.key_prefix if st else "rsc"

    def _wake_reader(self) -> None:
        """Interrupt a blocking XREADGROUP so control changes apply at once."""
        self._wake.set()
        conn_id = self._reader_conn_id
        if conn_id is not None and not self.cluster:
            with contextlib.suppress(Exception):
                self.client.execute_command("CLIENT UNBLOCK", conn_id)

    # ---- reader ------------------------------------------------------------------------

    def _reader_loop(self) -> None:
        backoff = 0.0
        next_drain_check = 0.0
        while not self._stopping.is_set():
            try:
                self._apply_control()
                if time.monotonic() >= self.read_deadline:
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                self._recover_step()
                now = time.monotonic()
                if now >= next_drain_check:
                    next_drain_check = now + self.cfg.drain_check_ms / 1000
                    self._check_drained()
                    self._sweep_orphans(now)
                self._read_once()
                backoff = 0.0
            except _NET_ERRORS as exc:
                self.stats["read_errors"] += 1
                backoff = min(2.0, backoff * 2 or 0.05)
                log.warning("redis error in reader (retry in %.2fs): %r", backoff, exc)
                self._reader_conn_id = None
                self._stopping.wait(backoff)
            except Exception:
                log.exception("unexpected error in reader")
                self._stopping.wait(0.5)

    def _apply_control(self) -> None:
        while self._control:
            op, arg = self._control.popleft()
            shard = arg.shard if op == "grant" else arg[0]
            try:
                if op == "grant":
                    self._start_shard(arg)
                elif op == "stop":
                    with self._lock:
                        st = self._shards.get(shard)
                        if st is not None and st.status not in (ABORTED, LOST):
                            st.status = arg[1]
            except BaseException:
                self._control.appendleft((op, arg))  # retried on the next turn
                raise
            with self._lock:
                self._queued[shard] -= 1
                if self._queued[shard] <= 0:
                    del self._queued[shard]
            self.changed.set()

    def _start_shard(self, grant: Grant) -> None:
        with self._lock:
            old = self._shards.get(grant.shard)
            st = ShardState(grant)
            if old is not None and old.last_id != "0" and old.token == grant.token:
                st.last_id = old.last_id
            self._shards[grant.shard] = st
            self._by_stream[st.stream] = st
            self._drained.discard(grant.shard)
        fence_key = st.keys.fence(self.group)
        ok, current = scripts.fence_raise(
            self.client, [fence_key], [grant.grant_epoch, grant.member_id]
        )
        if not ok:
            log.error(
                "shard %s: fence token %s is above our grant %s", grant.shard, current, st.token
            )
            self._mark_lost(st)
            return
        try:
            self.client.xgroup_create(st.stream, self.group, id=grant.start_id, mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        with self._lock:
            if st.status == STARTING:
                st.status = RECOVERING
        log.info("shard %s granted at epoch %s", grant.shard, grant.grant_epoch)

    def _reread_own_pending(self, active: Iterable[ShardState]) -> None:
        """After a failed read: the entries of a lost reply are in our PEL already, so the
        shards re-read it from the last id we dispatched before reading new ones again."""
        with self._lock:
            for st in active:
                if st.status == ACTIVE:
                    st.status, st.phase = RECOVERING, "own"
            self._reading_now = frozenset()

    def _mark_lost(self, st: ShardState) -> None:
        with self._lock:
            if st.status == ABORTED or self._shards.get(st.shard) is not st:
                # A late refusal for a grant we already gave up (C4) or that a newer grant
                # replaced: nothing we hold now is lost, so it must not fence us again.
                return
            st.status = LOST
            self._lost.add(st.shard)
        self.changed.set()

    def _recover_step(self) -> None:
        """One page of recovery per recovering shard and loop turn, so other shards keep
        flowing. Others' entries are first claimed to us (JUSTID, no delivery bump), then our
        whole PEL is read from 0: one sequence in ID order, own and others' together."""
        with self._lock:
            todo = [s for s in self._shards.values() if s.status == RECOVERING]
        for st in todo:
            if not self._wait_capacity():
                return
            try:
                self._recover_page(st)
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self.grant(st.grant)  # stream or group deleted under us: set it up again

    def _recover_page(self, st: ShardState) -> None:
        n = self.cfg.batch_size
        if st.phase == "claim":
            cursor = scripts.claim_ids(
                self.client, [st.stream], [self.group, self.consumer, st.claim_cursor, n]
            )[0]
            st.claim_cursor = cursor
            if cursor in ("0-0", b"0-0"):
                st.phase = "own"
            return
        reply = self.client.xreadgroup(self.group, self.consumer, {st.stream: st.last_id}, count=n)
        entries = _entries(reply).get(st.stream, [])
        if not entries:
            with self._lock:
                if st.status == RECOVERING:
                    st.status = ACTIVE
            return
        counts = self._delivery_counts(st, entries[0][0], entries[-1][0], len(entries))
        self._dispatch(st, entries, counts)

    def _delivery_counts(self, st: ShardState, lo: str, hi: str, n: int) -> dict[str, int]:
        rows = self.client.xpending_range(st.stream, self.group, lo, hi, n, self.consumer)
        return {r["message_id"]: int(r["times_delivered"]) for r in rows}

    def _sweep_orphans(self, now: float) -> None:
        """Safety net: entries another consumer holds on a shard we own exclusively can only
        be orphans (e.g. a stale owner's read that landed after our recovery claimed). Claim
        those idle for claim_idle_ms and dispatch them."""
        with self._lock:
            todo = [s for s in self._shards.values() if s.status == ACTIVE and now >= s.next_sweep]
        for st in todo:
            st.next_sweep = now + self.cfg.sweep_interval_ms / 1000
            _c, claimed, *_ = self.client.xautoclaim(
                st.stream,
                self.group,
                self.consumer,
                self.cfg.claim_idle_ms,
                "0-0",
                count=self.cfg.batch_size,
            )
            claimed = [e for e in claimed if e and e[1]]
            if claimed:
                log.warning("shard %s: claimed %d orphaned entries", st.shard, len(claimed))
                counts = self._delivery_counts(st, claimed[0][0], claimed[-1][0], len(claimed))
                self._dispatch(st, claimed, counts, advance=False)

    def _check_drained(self) -> None:
        with self._lock:
            todo = [s for s in self._shards.values() if s.status == ACTIVE]
        if not todo:
            return
        results = scripts.run_many(
            self.client,
            [(scripts.drained, [st.stream, st.grant.seal_key], [self.group]) for st in todo],
        )
        changed = False
        with self._lock:
            for st, res in zip(todo, results, strict=True):
                if res == 1 and st.shard not in self._drained and st.status == ACTIVE:
                    self._drained.add(st.shard)
                    changed = True
        if changed:
            self.changed.set()

    def _wait_capacity(self) -> bool:
        with self._capacity:
            while self._total_in_flight >= self.max_in_flight:
                if self._stopping.is_set() or self._control:
                    return False
                self._capacity.wait(0.1)
        return True

    def _read_once(self) -> None:
        if not self._wait_capacity():
            return
        with self._lock:
            active = [s for s in self._shards.values() if s.status == ACTIVE]
            recovering = any(s.status in (RECOVERING, STARTING) for s in self._shards.values())
        if not active:
            self._wake.wait(self.cfg.block_ms / 1000 if not recovering else 0)
            self._wake.clear()
            return
        if self.cluster:
            self._read_cluster(active, recovering)
            return
        if self._reader_conn_id is None:
            self._reader_conn_id = self.read_client.client_id()
        block = None if (recovering or self._control or self._wake.is_set()) else self.cfg.block_ms
        if block is not None and self.read_deadline != float("inf"):
            # A blocked read can deliver entries until it ends: not past the lease.
            block = max(1, min(block, int((self.read_deadline - time.monotonic()) * 1000)))
        self._wake.clear()
        streams = {s.stream: ">" for s in active}
        with self._lock:
            self._reading_now = frozenset(s.shard for s in active)
        try:
            reply = self.read_client.xreadgroup(
                self.group, self.consumer, streams, count=self.cfg.batch_size, block=block
            )
        except _NET_ERRORS:
            self._reread_own_pending(active)
            raise
        except ResponseError as exc:
            with self._lock:
                self._reading_now = frozenset()
            if "NOGROUP" in str(exc):  # stream or group deleted under us: set them up again
                for st in active:
                    self.grant(st.grant)
                return
            raise
        self._dispatch_reply(reply)

    def _dispatch_reply(self, reply: Any) -> None:
        try:
            for stream, entries in _entries(reply).items():
                st = self._by_stream.get(stream)
                if st is not None and entries:
                    self._dispatch(st, entries, None)
        finally:
            with self._lock:
                self._reading_now = frozenset()
            self.changed.set()

    def _read_cluster(self, active: list[ShardState], recovering: bool) -> None:
        """Redis Cluster refuses multi-slot XREADGROUP, and every shard has its own slot, so
        per node: one pipeline of non-blocking reads, one per shard; when all come back
        empty, one short BLOCK on a single shard (or the wake event) before the next round."""
        by_node: dict[Any, list[ShardState]] = defaultdict(list)
        for st in active:
            by_node[self.read_client.get_node_from_key(st.stream).name].append(st)
        got = 0
        with self._lock:
            self._reading_now = frozenset(s.shard for s in active)
        try:
            for node_name, shards in by_node.items():
                node = self.read_client.get_node(node_name=node_name)
                node_client = self.read_client.get_redis_connection(node)
                pipe = node_client.pipeline(transaction=False)
                for st in shards:
                    pipe.xreadgroup(
                        self.group, self.consumer, {st.stream: ">"}, count=self.cfg.batch_size
                    )
                for st, reply in zip(shards, pipe.execute(), strict=True):
                    entries = _entries(reply).get(st.stream, [])
                    if entries:
                        got += len(entries)
                        self._dispatch(st, entries, None)
        except _NET_ERRORS:
            self._reread_own_pending(active)
            raise
        finally:
            with self._lock:
                self._reading_now = frozenset()
            self.changed.set()
        if not got and not recovering:
            self._wake.wait(min(self.cfg.block_ms, 50) / 1000)
            self._wake.clear()

    def _dispatch(
        self,
        st: ShardState,
        entries: list[Any],
        counts: dict[str, int] | None,
        advance: bool = True,
    ) -> None:
        """Hand entries to workers: one list per worker (keys hash to workers) and call."""
        key_field = self.cfg.key_field
        nworkers = self.cfg.workers
        shard = st.shard
        per_worker: list[list[Message]] = [[] for _ in range(nworkers)]
        gone: list[str] = []  # deleted/trimmed entries still in our PEL: nothing to run
        for entry in entries:
            msg_id, fields = entry[0], entry[1]
            if not fields:
                gone.append(msg_id)
                continue
            key = fields.get(key_field)
            if key is None:
                key = msg_id  # keyless: no order to keep, spread them
            dc = counts.get(msg_id, 1) if counts is not None else 1
            per_worker[hash(key) % nworkers].append(Message(shard, msg_id, key, fields, dc))
        n = len(entries)
        with self._lock:
            st.in_flight += n
            self._total_in_flight += n
            if advance:
                st.last_id = entries[-1][0]
        for i, msgs in enumerate(per_worker):
            if msgs:
                self._queues[i].put((st, msgs))
        if gone:
            self._acks.put((st, gone, 0))

    # ---- workers -----------------------------------------------------------------------

    def _worker_loop(self, q: SimpleQueue[Any]) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            st, msgs = item
            try:
                self._run_batch(st, msgs)
            except Exception:
                log.exception("worker failed on a batch of %s", st.shard)
                self._acks.put((st, [], len(msgs)))

    def _run_batch(self, st: ShardState, msgs: list[Message]) -> None:
        if self.cfg.ack == "before":
            self._run_batch_ack_before(st, msgs)
            return
        done: list[str] = []
        # Finished without an ACK by the acker: left pending (shard stopping) or moved to the
        # DLQ (its script ACKed). They still count down the shard's in-flight number.
        other = 0
        handler = self.handler
        for i, msg in enumerate(msgs):
            if st.status is not ACTIVE and st.status is not RECOVERING:
                other += len(msgs) - i  # left pending for the next owner (or our recovery)
                break
            if msg.delivery_count > self.cfg.max_deliveries:
                # Came back more often than allowed (e.g. it crashed the process): DLQ it.
                self._to_dlq(st, msg, "max deliveries exceeded before handling", True)
                other += 1
                continue
            try:
                handler(msg)
            except Exception as exc:
                outcome = self._retry(st, msg, exc, ack=True)
                if outcome == "ack":
                    done.append(msg.id)
                elif outcome == "dlq":
                    other += 1
                else:  # "stop"
                    other += len(msgs) - i
                    break
                continue
            done.append(msg.id)
        self.stats["handled"] += len(done)
        self._acks.put((st, done, other))

    def _run_batch_ack_before(self, st: ShardState, msgs: list[Message]) -> None:
        if st.status is not ACTIVE and st.status is not RECOVERING:
            self._acks.put((st, [], len(msgs)))
            return
        res = self._ack_now(st, [m.id for m in msgs])
        if res == -1:
            self._acks.put((st, [], len(msgs)))
            return
        for msg in msgs:
            try:
                self.handler(msg)
            except Exception as exc:
                self._retry(st, msg, exc, ack=False)
        self.stats["handled"] += len(msgs)
        self._acks.put((st, [], len(msgs)))

    def _retry(self, st: ShardState, msg: Message, exc: Exception, *, ack: bool) -> str:
        """Run the handler again with backoff until it succeeds, the message has been
        delivered max_deliveries times (then DLQ), or the shard stops. Returns "ack",
        "dlq" or "stop"."""
        delay = self.cfg.retry_backoff_ms / 1000
        while True:
            self.stats["failed"] += 1
            if msg.delivery_count >= self.cfg.max_deliveries:
                self._to_dlq(st, msg, f"{type(exc).__name__}: {exc}", ack)
                return "dlq"
            log.info(
                "handler failed on %s %s (delivery %d): %r",
                st.shard,
                msg.id,
                msg.delivery_count,
                exc,
            )
            if self._stopping.wait(delay * (0.5 + random.random() / 2)):
                return "stop"
            if st.status is not ACTIVE and st.status is not RECOVERING:
                return "stop"
            delay = min(self.cfg.retry_backoff_max_ms / 1000, delay * 2)
            msg.delivery_count += 1
            try:
                self.handler(msg)
                return "ack"
            except Exception as again:
                exc = again

    def _to_dlq(self, st: ShardState, msg: Message, error: str, ack: bool) -> None:
        args: list[Any] = [
            self.group,
            st.token,
            self.ack_mode,
            msg.id,
            "1" if ack else "0",
            self.cfg.dlq_maxlen,
            "dlq:error",
            error[:2000],
            "dlq:deliveries",
            msg.delivery_count,
            "dlq:id",
            msg.id,
            "dlq:shard",
            st.shard,
            "dlq:group",
            self.group,
        ]
        for k, v in msg.fields.items():
            args += (k, v)
        keys = [st.stream, st.keys.fence(self.group), st.keys.dlq(self.group)]
        res = self._call_retrying(lambda: scripts.dlq(self.client, keys, args))
        if res == -1:
            self._mark_lost(st)
            return
        self.stats["dlq"] += 1
        log.warning(
            "message %s of %s moved to %s after %d deliveries",
            msg.id,
            st.shard,
            keys[2],
            msg.delivery_count,
        )

    def _ack_now(self, st: ShardState, ids: list[str]) -> int:
        keys = [st.stream, st.keys.fence(self.group)]
        res = self._call_retrying(
            lambda: scripts.ack(self.client, keys, [self.group, st.token, self.ack_mode, *ids])
        )
        if res == -1:
            self._mark_lost(st)
        return int(res)

    def _call_retrying(self, fn: Callable[[], Any]) -> Any:
        delay = 0.05
        while True:
            try:
                return fn()
            except _NET_ERRORS as exc:
                if self._stopping.is_set():
                    raise
                log.warning("redis error (retry in %.2fs): %r", delay, exc)
                time.sleep(delay)
                delay = min(2.0, delay * 2)

    # ---- acker -------------------------------------------------------------------------

    def _acker_loop(self) -> None:
        while True:
            item = self._acks.get()
            items = [item]
            while True:  # drain what piled up meanwhile: batching grows with load
                try:
                    items.append(self._acks.get_nowait())
                except Empty:
                    break
            stop = any(i is None for i in items)
            self._flush([i for i in items if i is not None])
            if stop:
                return

    def _flush(self, items: list[tuple[ShardState, list[str], int]]) -> None:
        ids_by: dict[ShardState, list[str]] = {}
        finished: dict[ShardState, int] = defaultdict(int)
        for st, ids, dropped in items:
            finished[st] += len(ids) + dropped
            if ids and st.status is not ABORTED and st.status is not LOST:
                ids_by.setdefault(st, []).extend(ids)
        if ids_by:
            self._ack_many(ids_by)
        with self._capacity:
            for st, n in finished.items():
                st.in_flight -= n
                self._total_in_flight -= n
            self._capacity.notify_all()
        self.changed.set()

    def _ack_many(self, ids_by: dict[ShardState, list[str]]) -> None:
        order = list(ids_by.items())
        delay = 0.05
        while order:
            try:
                results = scripts.run_many(
                    self.client,
                    [
                        (
                            scripts.ack,
                            [st.stream, st.keys.fence(self.group)],
                            [self.group, st.token, self.ack_mode, *ids],
                        )
                        for st, ids in order
                    ],
                )
            except _NET_ERRORS as exc:
                if self._stopping.is_set() and delay > 1:
                    log.error("giving up ACKs on shutdown: %r", exc)
                    return  # they stay pending: redelivered, which is at-least-once
                log.warning("ACK failed (retry in %.2fs): %r", delay, exc)
                time.sleep(delay)
                delay = min(2.0, delay * 2)
                continue
            retry: list[tuple[ShardState, list[str]]] = []
            for (st, ids), res in zip(order, results, strict=True):
                if isinstance(res, Exception):
                    if isinstance(res, _NET_ERRORS):
                        retry.append((st, ids))
                    else:
                        log.error("ACK of %d entries on %s failed: %r", len(ids), st.shard, res)
                elif res == -1:
                    log.error("ACK refused on %s: fence token moved past %s", st.shard, st.token)
                    self._mark_lost(st)
                else:
                    self.stats["acked"] += len(ids)
            order = [(st, ids) for st, ids in retry if st.status not in (ABORTED, LOST)]
            if order:
                if self._stopping.is_set() and delay > 1:
                    log.error("giving up %d ACK batches on shutdown", len(order))
                    return
                time.sleep(delay)  # a node is unreachable: back off before retrying
                delay = min(2.0, delay * 2)


def _entries(reply: Any) -> dict[str, list[Any]]:
    """XREADGROUP reply (RESP2 list or RESP3 map) -> {stream: [(id, fields), ...]}."""
    if not reply:
        return {}
    if isinstance(reply, dict):
        return {
            k: (v[0] if v and isinstance(v[0], list) and v[0] and isinstance(v[0][0], list) else v)
            for k, v in reply.items()
        }
    return {stream: entries for stream, entries in reply}
