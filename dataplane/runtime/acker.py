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

from .. import scripts
from ..backoff import Backoff, retry_call
from ..connections import NET_ERRORS
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
    def __init__(self, fenced: Fenced, table: ShardTable, stopping: threading.Event) -> None:
        self.fenced = fenced
        self.table = table
        self.stopping = stopping
        self.queue: SimpleQueue[Finished | None] = SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="dp-acker", daemon=True)

    def put(self, finished: Finished) -> None:
        self.queue.put(finished)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float) -> None:
        """Flush what is queued, then end (call after the workers ended)."""
        self.queue.put(None)
        self.thread.join(timeout)

    def _loop(self) -> None:
        while True:
            items = [self.queue.get()]
            while True:  # drain what piled up meanwhile: batching grows with load
                try:
                    items.append(self.queue.get_nowait())
                except Empty:
                    break
            self._flush([i for i in items if i is not None])
            if None in items:
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
                results = scripts.run_many(self.fenced.client, calls)
            except NET_ERRORS as exc:
                results = [exc] * len(order)
            retry: list[tuple[ShardState, list[str]]] = []
            for (st, ids), res in zip(order, results, strict=True):
                if isinstance(res, NET_ERRORS):
                    retry.append((st, ids))
                elif isinstance(res, Exception):
                    log.error("ACK of %d entries on %s failed: %r", len(ids), st.shard, res)
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
