"""The worker part: dispatch of read entries to lanes, and the thread workers.

A key always maps to the same lane (``hash(key) % lanes``; entries without the key field use
their ID), and a lane runs its messages one after another: per-key order holds while
different keys run in parallel. Each read costs one hand-over per lane: the lane gets a list
of :class:`Batch` (one per shard the read delivered), never one message (or one shard) per
thread hop; each batch's :class:`Finished` goes to the acker as soon as it is done. A sync
handler runs on ``workers`` threads, one per lane; an async handler on one event loop
(async_workers.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from queue import SimpleQueue
from typing import Any, Protocol

from ..errors import BatchItemsFailed, RedisPermissionError, is_noperm
from ..message import REPLAY_FOR, Message
from .acker import Acker, Fenced, Finished
from .retry import Outcome, Retry, Tally
from .shard_table import ShardState, ShardStatus, ShardTable

ACTIVE, RECOVERING = ShardStatus.ACTIVE, ShardStatus.RECOVERING

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Batch:
    """Messages of one shard and read for one lane, in ID order."""

    shard: ShardState
    messages: list[Message]


class Workers(Protocol):
    lanes: int

    def submit(self, per_lane: list[list[Batch]]) -> None: ...
    def start(self) -> None: ...
    def stop(self, timeout: float) -> None: ...


class Dispatcher:
    """Turns entries read from shards into Messages, counted in flight, one list per lane."""

    def __init__(
        self, key_field: str, table: ShardTable, workers: Workers, acker: Acker, group: str
    ) -> None:
        self.key_field = key_field
        self.group = group
        self.table = table
        self.workers = workers
        self.acker = acker

    def dispatch(
        self,
        st: ShardState,
        entries: list[Any],
        counts: dict[str, int] | None = None,
        advance: bool = True,
    ) -> None:
        """``counts``: delivery counts of recovered entries (new ones are at 1); ``advance``:
        move the shard's re-read position to the last entry."""
        self.dispatch_read([(st, entries)], counts, advance)

    def dispatch_read(
        self,
        reads: list[tuple[ShardState, list[Any]]],
        counts: dict[str, int] | None = None,
        advance: bool = True,
        *,
        flat: bool = False,
    ) -> None:
        """Everything one read delivered, over several shards: each lane gets one hand-over
        (a list of batches), not one per shard. ``flat``: the fields are Redis's flat
        [field, value, ...] lists (turned into dicts here, in the same pass)."""
        key_field, group = self.key_field, self.group
        lanes = self.workers.lanes
        per_lane: list[list[Batch]] = [[] for _ in range(lanes)]
        gone: list[Finished] = []
        for st, entries in reads:
            # The per-message path: one pass, no intermediate lists.
            shard = st.shard
            msgs_by_lane: list[list[Message]] = [[] for _ in range(lanes)]
            to_lane = [msgs.append for msgs in msgs_by_lane]
            # Deleted/trimmed entries still in our PEL, and another group's DLQ replay:
            # nothing to run here, only to ACK.
            dead: list[str] = []
            for entry in entries:
                msg_id, fields = entry[0], entry[1]
                if not fields:
                    dead.append(msg_id)
                    continue
                if flat:
                    # Few fields is the common case: a dict display builds them in about a
                    # third of the time of dict(zip(...)) (issue 25: the reader's own work is
                    # the consumer's critical path). Repeated names: the last wins, as in zip.
                    n = len(fields)
                    if n == 4:
                        f0, v0, f1, v1 = fields
                        fields = {f0: v0, f1: v1}
                    elif n == 2:
                        fields = {fields[0]: fields[1]}
                    elif n == 6:
                        f0, v0, f1, v1, f2, v2 = fields
                        fields = {f0: v0, f1: v1, f2: v2}
                    else:
                        it = iter(fields)
                        fields = dict(zip(it, it))  # noqa: B905 - pairs by construction
                replay_for = fields.get(REPLAY_FOR)
                if replay_for is not None and replay_for != group:
                    dead.append(msg_id)
                    continue
                key = fields.get(key_field)
                if key is None:
                    key = msg_id  # keyless: no order to keep, spread them
                dc = 1 if counts is None else counts.get(msg_id, 1)
                to_lane[hash(key) % lanes](Message(shard, msg_id, key, fields, dc))
            self.table.add(st, len(entries), entries[-1][0] if advance else None)
            for batches, msgs in zip(per_lane, msgs_by_lane, strict=True):
                if msgs:
                    batches.append(Batch(st, msgs))
            if dead:
                gone.append(Finished(st, dead))
        self.workers.submit(per_lane)
        if gone:
            self.acker.put(gone)


class LaneWorkers:
    """What the thread and the coroutine workers share: the handler and the parts they call."""

    def __init__(
        self,
        handler: Callable[[Message], Any],
        lanes: int,
        retry: Retry,
        acker: Acker,
        fenced: Fenced,
        stopping: threading.Event,
        *,
        ack_before: bool,
        batch: bool = False,
    ) -> None:
        self.handler = handler
        self.batch = batch  # the handler takes a list of one shard's messages
        self.lanes = lanes
        self.retry = retry
        self.acker = acker
        self.fenced = fenced
        self.stopping = stopping
        self.ack_before = ack_before

    def failed_batch(self, batch: Batch, exc: Exception) -> None:
        """A batch's ACK or DLQ move raised: an ACL refusal stops the member (issue 27.6)."""
        if is_noperm(exc):
            log.error("Redis refused a worker on %s: %s", batch.shard.shard, exc)
            self.fenced.table.fail(RedisPermissionError("ACK or dead-letter messages", exc))
        else:
            log.exception("worker failed on a batch of %s", batch.shard.shard)


class ThreadWorkers(LaneWorkers):
    """A sync handler on ``lanes`` threads, each owning a queue."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queues: list[SimpleQueue[list[Batch] | None]] = [
            SimpleQueue() for _ in range(self.lanes)
        ]
        self.threads = [
            threading.Thread(target=self._loop, args=(q,), name=f"dp-worker-{i}", daemon=True)
            for i, q in enumerate(self.queues)
        ]

        if self.batch:
            self._run = self._run_batch  # type: ignore[method-assign]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self, timeout: float) -> None:
        """Let each thread finish what it holds, then end."""
        for q in self.queues:
            q.put(None)
        for t in self.threads:
            t.join(timeout)

    def submit(self, per_lane: list[list[Batch]]) -> None:
        for q, batches in zip(self.queues, per_lane, strict=True):
            if batches:
                q.put(batches)

    def _loop(self, q: SimpleQueue[list[Batch] | None]) -> None:
        while (batches := q.get()) is not None:
            for batch in batches:
                try:
                    finished = self._run(batch)
                except Exception as exc:
                    self.failed_batch(batch, exc)
                    finished = Finished(batch.shard, settled=len(batch.messages))
                # At once, not after the lane's other batches: a slow handler on another
                # shard must not hold back this shard's ACKs (and its revocation).
                self.acker.put([finished])

    def _run(self, batch: Batch) -> Finished:
        if self.ack_before:
            return self._run_ack_before(batch)
        st, msgs = batch.shard, batch.messages
        tally = Tally()
        done, handler, max_deliveries = tally.ids, self.handler, self.retry.cfg.max_deliveries
        for i, msg in enumerate(msgs):
            # The per-message path: identity checks and a bare append (this loop runs for
            # every message; the enum's hash is a Python call).
            status = st.status
            if status is not ACTIVE and status is not RECOVERING:
                outcome = Outcome.STOP
            elif msg.delivery_count > max_deliveries:
                outcome = self.retry.dead_letter_unrun(st, msg)
            else:
                try:
                    handler(msg)
                    done.append(msg.id)
                    continue
                except Exception as exc:
                    outcome = self._retry(st, msg, exc, ack=True)
            if not tally.add(msg, outcome, len(msgs) - i):
                break
        return Finished(st, tally.ids, tally.settled)

    def _run_batch(self, batch: Batch) -> Finished:
        """A batch handler: the lane's messages of one shard in one call (batch_failures)."""
        st, msgs = batch.shard, batch.messages
        tally = Tally()
        if self.ack_before and (
            not st.handling or self.fenced.ack_now(st, [m.id for m in msgs]) == -1
        ):
            return Finished(st, settled=len(msgs))
        todo = self.retry.batch_runnable(st, msgs, tally, ack=not self.ack_before)
        backoff = self.retry.backoff()
        while todo:
            if not st.handling:
                tally.settled += len(todo)  # left pending for the next owner
                break
            try:
                self.handler(list(todo))  # type: ignore[arg-type]
                failed: dict[str, Exception] = {}
            except BatchItemsFailed as partial:
                failed = partial.failed
            except Exception as exc:
                failed = dict.fromkeys((m.id for m in todo), exc)
            todo = self.retry.batch_failures(st, todo, failed, tally, ack=not self.ack_before)
            if todo and (backoff.wait(self.stopping) or not self.retry.again_all(st, todo)):
                tally.settled += len(todo)
                break
        if self.ack_before:
            return Finished(st, settled=len(msgs))
        return Finished(st, tally.ids, tally.settled)

    def _run_ack_before(self, batch: Batch) -> Finished:
        st, msgs = batch.shard, batch.messages
        if st.handling and self.fenced.ack_now(st, [m.id for m in msgs]) != -1:
            for msg in msgs:
                try:
                    self.handler(msg)
                except Exception as exc:
                    self._retry(st, msg, exc, ack=False)
        return Finished(st, settled=len(msgs))

    def _retry(self, st: ShardState, msg: Message, exc: Exception, *, ack: bool) -> Outcome:
        backoff = self.retry.backoff()
        while (outcome := self.retry.failed(st, msg, exc, ack=ack)) is None:
            if backoff.wait(self.stopping) or not self.retry.again(st, msg):
                return Outcome.STOP
            try:
                self.handler(msg)
                return Outcome.ACK
            except Exception as again:
                exc = again
        return outcome
