"""The reader: one thread per runtime that alone takes new entries into our PEL.

Each turn it applies queued control ops (start/stop shards), runs a page of recovery, now and
then checks drains and sweeps orphans, then reads. Reads are fenced in Redis: a NON-blocking
XREADGROUP runs only over shards whose fence token is still ours, checked atomically with the
read (fenced_read.py; on Redis Cluster the script ``scripts.FENCED_READ`` per shard). A shard
whose token moved is refused and marked lost; nothing enters our PEL. Only when that read came
back empty does the reader wait, with a plain ``XREAD BLOCK`` after each stream's last entry:
it returns when something new arrives and delivers nothing to any PEL, so a member that stalls
inside the wait cannot take entries of a shard it lost meanwhile. Control changes interrupt
the wait by shutting the waiting connection's socket down from this process (the wait
delivers to no PEL, so nothing is lost; the reader reconnects at once). Not ``CLIENT
UNBLOCK``: a member role allowed that could unblock any client of the server, other groups'
readers included (issue 27.6).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections import defaultdict
from typing import Any

from redis.exceptions import ResponseError

from .. import scripts
from ..backoff import Backoff
from ..connections import NET_ERRORS
from ..errors import RedisPermissionError, is_noperm
from ..wire import HeldConnection
from .config import RuntimeConfig
from .fenced_read import FencedReader
from .recovery import Recovery
from .shard_table import ShardState, ShardStatus, ShardTable, StartShard
from .workers import Dispatcher

log = logging.getLogger(__name__)


class Reader:
    def __init__(
        self,
        client: Any,
        read_client: Any,
        group: str,
        consumer: str,
        cfg: RuntimeConfig,
        table: ShardTable,
        recovery: Recovery,
        dispatcher: Dispatcher,
        stopping: threading.Event,
        *,
        cluster: bool,
    ) -> None:
        self.client = client
        self.read_client = read_client
        self.group = group
        self.consumer = consumer
        self.cfg = cfg
        self.table = table
        self.recovery = recovery
        self.dispatcher = dispatcher
        self.stopping = stopping
        self.cluster = cluster
        self.wake = threading.Event()
        # The reader's own connection (standalone): reads and waits.
        self.conn = HeldConnection(read_client, on_connect=self._on_connect)
        self.fenced: FencedReader | None = None  # fenced reads on that connection
        # The wait's socket while the reader waits on it (under _wait_lock): wake_up shuts it
        # down; _interrupted tells the reader that the error that follows is ours.
        self._wait_lock = threading.Lock()
        self._waiting_sock: socket.socket | None = None
        self._interrupted = False
        # The session lease (time.monotonic() seconds), kept by the Consumer: see
        # Runtime.read_deadline. inf: no lease (direct use).
        self.read_deadline = float("inf")
        self.redis_ok = True  # the last turn reached Redis (health)
        self.metrics: Any = None  # dataplane.metrics.Metrics or None
        self.paused = False  # §11: the group is paused: apply control ops, read nothing
        self.thread = threading.Thread(target=self._loop, name="dp-reader", daemon=True)

    def wake_up(self) -> None:
        """Interrupt a blocking wait so control changes apply at once."""
        self.wake.set()
        with self._wait_lock:
            sock, self._waiting_sock = self._waiting_sock, None
            if sock is not None:
                self._interrupted = True
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _loop(self) -> None:
        backoff = Backoff(0.05, 2.0, jitter=False)
        next_drain_check = 0.0
        while not self.stopping.is_set():
            try:
                self._apply_control()
                if self.paused or time.monotonic() >= self.read_deadline:
                    self.wake.wait(0.05)
                    self.wake.clear()
                    continue
                self.recovery.step()
                now = time.monotonic()
                if now >= next_drain_check:
                    next_drain_check = now + self.cfg.drain_check_ms / 1000
                    self.recovery.check_drained()
                    self.recovery.sweep_orphans(now)
                self._read_once()
                backoff.reset()
                self.redis_ok = True
            except NET_ERRORS as exc:
                self.redis_ok = False
                log.warning("redis error in reader (retrying): %r", exc)
                self._drop_connection()
                backoff.wait(self.stopping)
            except Exception as exc:
                if is_noperm(exc):  # an ACL does not heal: the driver stops (issue 27.6)
                    log.error("Redis refused the reader: %s", exc)
                    self.table.fail(exc if isinstance(exc, RedisPermissionError)
                                    else RedisPermissionError("read or set up its shards", exc))
                else:
                    log.exception("unexpected error in reader")
                self.stopping.wait(0.5)

    def _apply_control(self) -> None:
        while (op := self.table.next_control()) is not None:
            if isinstance(op, StartShard):
                self.recovery.start_shard(op.grant)
            else:
                self.table.apply_stop(op)
            self.table.control_done(op)  # after an exception the op stays first: retried

    def _read_once(self) -> None:
        if not self.table.wait_capacity(self.stopping):
            return
        active = self.table.with_status(ShardStatus.ACTIVE)
        recovering = bool(self.table.with_status(ShardStatus.RECOVERING, ShardStatus.STARTING))
        if not active:
            self.wake.wait(self.cfg.block_ms / 1000 if not recovering else 0)
            self.wake.clear()
            return
        if self.cluster:
            self._read_cluster(active, recovering)
            return
        conn = self.conn.get()
        urgent = recovering or self.table.has_control() or self.wake.is_set()
        self.wake.clear()
        waits = self._fenced_read(active)
        if waits and not urgent:
            self._wait(conn, waits)

    def _wait(self, conn: Any, waits: dict[str, str]) -> None:
        """Wait for new entries; delivers to no PEL: it only tells us when to read again."""
        block = ("BLOCK", self.cfg.block_ms, "STREAMS", *waits, *waits.values())
        with self._wait_lock:
            if self.wake.is_set():
                return  # a wake_up came in meanwhile: read again instead
            self._waiting_sock = getattr(conn, "_sock", None)
        try:
            conn.send_command("XREAD", "COUNT", 1, *block)
            conn.read_response()
        except NET_ERRORS:
            with self._wait_lock:
                interrupted, self._interrupted = self._interrupted, False
            if not interrupted:
                raise
            self._drop_connection()  # shut down by wake_up: a new connection next turn
        finally:
            with self._wait_lock:
                self._waiting_sock = None
                if self._interrupted:  # shut down after the reply came: unusable as well
                    self._interrupted = False
                    self._drop_connection()

    def _on_connect(self, conn: Any) -> None:
        self.fenced = FencedReader(conn, self.group, self.consumer, self.cfg.batch_size)

    def _drop_connection(self) -> None:
        self.fenced = None
        self.conn.drop()

    def close(self) -> None:
        """After the thread ended: give the connection back."""
        self._drop_connection()

    def _fenced_read(self, active: list[ShardState]) -> dict[str, str]:
        """Read new entries of the shards still ours; returns {stream: id to wait after} when
        nothing was read (empty: something was read, or nothing is readable)."""
        assert self.fenced is not None  # noqa: S101 - narrowing: made with the connection
        self.table.begin_read(active)
        try:
            res = self.fenced.read(active)
        except NET_ERRORS:
            self.table.reread_own_pending(active)
            raise
        except ResponseError as exc:
            self.table.end_read()
            if "NOGROUP" not in str(exc):
                raise
            for st in active:  # stream or group deleted under us: set them up again
                self.table.enqueue(StartShard(st.grant))
            return {}
        try:
            self._refuse(res.refused)
            by_stream = self.table.by_stream
            reads = [(o, e) for s, e in res.entries.items() if (o := by_stream(s)) is not None]
            if reads:
                self.dispatcher.dispatch_read(reads, flat=True)
        finally:
            self.table.end_read()
        return res.waits

    def _refuse(self, refused: list[ShardState]) -> None:
        """Mark the shards a fenced read refused lost: their fence token moved on."""
        for st in refused:
            log.warning("read refused on %s: fence token moved past %s", st.shard, st.token)
            if self.metrics is not None:
                self.metrics.fenced_reads_refused.labels(st.shard).inc()
            self.table.mark_lost(st)

    def _read_cluster(self, active: list[ShardState], recovering: bool) -> None:
        """Redis Cluster refuses multi-slot scripts and reads, and every shard has its own
        slot: one fenced read per shard, pipelined per node; when all come back empty, a
        short wait on the wake event before the next round."""
        calls = [
            (scripts.fenced_read, [st.stream, st.keys.fence(self.group)],
             [self.group, self.consumer, self.cfg.batch_size, st.token])
            for st in active
        ]  # fmt: skip
        got = 0
        reads: list[tuple[ShardState, list[Any]]] = []
        self.table.begin_read(active)
        try:
            results = scripts.run_many(self.read_client, calls)
            if any(isinstance(res, NET_ERRORS) for res in results):
                raise next(res for res in results if isinstance(res, NET_ERRORS))
            by_problem: dict[str, list[ShardState]] = defaultdict(list)
            for st, res in zip(active, results, strict=True):
                if isinstance(res, Exception):
                    by_problem["NOGROUP" if "NOGROUP" in str(res) else "error"].append(st)
                    continue
                refused, reply, _tails = res
                if refused:
                    self._refuse([st])
                for _stream, entries in reply or ():
                    got += len(entries)
                    reads.append((st, entries))
            if reads:
                self.dispatcher.dispatch_read(reads, flat=True)
            for st in by_problem["NOGROUP"]:
                self.table.enqueue(StartShard(st.grant))
            if by_problem["error"]:
                raise next(
                    r for r in results if isinstance(r, Exception) and "NOGROUP" not in str(r)
                )
        except NET_ERRORS:
            self.table.reread_own_pending(active)
            raise
        finally:
            self.table.end_read()
        if not got and not recovering:
            self.wake.wait(min(self.cfg.block_ms, 50) / 1000)
            self.wake.clear()
