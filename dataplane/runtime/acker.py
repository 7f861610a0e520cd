"""The acker: one thread that ACKs whatever the workers finished, per shard, fenced.

It drains everything that piled up since its last round, so ACK batching grows with load by
itself; each shard's IDs go to one fenced ACK script call, all calls in one pipeline.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from queue import Empty, SimpleQueue
from typing import Any

from redis.exceptions import ResponseError

from .. import scripts
from ..backoff import Backoff, retry_call
from ..connections import NET_ERRORS
from ..errors import RedisPermissionError, is_noperm
from ..wire import HeldConnection
from .shard_table import FINAL, ShardState, ShardTable

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Finished:
    """Messages of one shard the workers are done with."""

    shard: ShardState
    ack: list[str] = field(default_factory=list)  # IDs for the acker to ACK
    settled: int = 0  # done without an ACK from us: left pending, moved to the DLQ, ACKed before


class Fenced:
    """The fenced single-shard scripts (ACK now, DLQ move), retried on network errors."""

    def __init__(self, client: Any, group: str, table: ShardTable, stopping: threading.Event):
        self.client = client
        self.group = group
        self.table = table
        self.stopping = stopping
        self.ack_mode = "XACK"

    def call(self, fn: Callable[[], Any], what: str) -> Any:
        backoff = Backoff(0.05, 2.0, jitter=False)
        return retry_call(fn, NET_ERRORS, backoff, log=log, what=what, stop=self.stopping)

    def ack_args(self, st: ShardState, ids: list[str]) -> tuple[list[str], list[Any]]:
        return [st.stream, st.keys.fence(self.group)], [self.group, st.token, self.ack_mode, *ids]

    def ack_now(self, st: ShardState, ids: list[str]) -> int:
        """ACK at once (ack="before"); -1 (and the shard marked lost) when refused."""
        keys, args = self.ack_args(st, ids)
        res = int(self.call(lambda: scripts.ack(self.client, keys, args), "ACK"))
        if res == -1:
            self.table.mark_lost(st)
        return res


class Acker:
    def __init__(
        self, fenced: Fenced, table: ShardTable, stopping: threading.Event, *, cluster: bool
    ) -> None:
        self.fenced = fenced
        self.table = table
        self.stopping = stopping
        self.cluster = cluster
        self.conn = HeldConnection(fenced.client)  # standalone: the ACK round trips
        self.queue: SimpleQueue[list[Finished] | None] = SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="dp-acker", daemon=True)

    def put(self, finished: list[Finished]) -> None:
        """Hand over what a worker finished (one list per hand-over, not per shard)."""
        self.queue.put(finished)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float) -> None:
        """Flush what is queued, then end (call after the workers ended)."""
        self.queue.put(None)
        self.thread.join(timeout)
        if not self.thread.is_alive():
            self.conn.drop()

    def _loop(self) -> None:
        while True:
            got = [self.queue.get()]
            while True:  # drain what piled up meanwhile: batching grows with load
                try:
                    got.append(self.queue.get_nowait())
                except Empty:
                    break
            self._flush([f for batch in got if batch is not None for f in batch])
            if None in got:
                return

    def _flush(self, items: list[Finished]) -> None:
        ids_by: dict[ShardState, list[str]] = {}
        finished: dict[ShardState, int] = defaultdict(int)
        for f in items:
            finished[f.shard] += len(f.ack) + f.settled
            if f.ack and f.shard.status not in FINAL:
                ids_by.setdefault(f.shard, []).extend(f.ack)
        if ids_by:
            self._ack_many(ids_by)
        self.table.finish(finished)

    def _ack_many(self, ids_by: dict[ShardState, list[str]]) -> None:
        order = list(ids_by.items())
        backoff = Backoff(0.05, 2.0, jitter=False)
        while order:
            calls = [(scripts.ack, *self.fenced.ack_args(st, ids)) for st, ids in order]
            try:
                results = self._run(calls)
            except NET_ERRORS as exc:
                results = [exc] * len(order)
            retry: list[tuple[ShardState, list[str]]] = []
            for (st, ids), res in zip(order, results, strict=True):
                if isinstance(res, NET_ERRORS):
                    retry.append((st, ids))
                elif isinstance(res, Exception):
                    log.error("ACK of %d entries on %s failed: %r", len(ids), st.shard, res)
                    if is_noperm(res):  # an ACL does not heal: the driver stops (issue 27.6)
                        self.table.fail(RedisPermissionError("ACK messages", res))
                elif res == -1:
                    log.warning("ACK refused on %s: fence token moved past %s", st.shard, st.token)
                    self.table.mark_lost(st)
            order = [(st, ids) for st, ids in retry if st.status not in FINAL]
            if not order:
                return
            if self.stopping.is_set() and backoff.failures >= 5:
                # They stay pending: redelivered to the next owner, which is at-least-once.
                log.error("giving up %d ACK batches on shutdown", len(order))
                return
            log.warning("ACK of %d shards failed (a node is unreachable): retrying", len(order))
            backoff.wait()

    def _run(self, calls: list[tuple[scripts.Lua, list[str], list[Any]]]) -> list[Any]:
        """The ACK calls in one round trip (results or exceptions, in order). Standalone: by
        SHA on the acker's own connection, packed by hiredis; a script the server lost (restart,
        SCRIPT FLUSH) is loaded again by the single call that redoes it."""
        client = self.fenced.client
        if self.cluster:
            return scripts.run_many(client, calls)
        commands = [("EVALSHA", lua.sha, len(keys), *keys, *args) for lua, keys, args in calls]
        results = self.conn.roundtrip(commands)
        for i, res in enumerate(results):
            if isinstance(res, ResponseError) and scripts.is_noscript(res):
                lua, keys, args = calls[i]
                try:
                    results[i] = lua(client, keys, args)
                except Exception as exc:
                    results[i] = exc
        return results
