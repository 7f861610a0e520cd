"""The worker part for ``async def`` handlers: one event loop thread, ``max_concurrency``
lanes, each a task running its batches one message after another.

The lanes give the same guarantees as the worker threads (a key always maps to one lane, so
per-key order holds) and bound the coroutines in flight to ``max_concurrency``. Retries, the
DLQ step and fenced ACKs are the thread workers' (retry.py, acker.py); the rare blocking Redis
calls on the way (DLQ move, ACK before handling) run in a helper thread so that they do not
stall the other lanes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from queue import Empty, SimpleQueue
from typing import Any

from ..errors import BatchItemsFailed
from ..message import Message
from .acker import Finished
from .retry import Outcome, Tally
from .shard_table import ShardState
from .workers import ACTIVE, RECOVERING, Batch, LaneWorkers

log = logging.getLogger(__name__)


class AsyncWorkers(LaneWorkers):
    handler: Callable[[Message], Awaitable[Any]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop = asyncio.new_event_loop()
        self.queues: list[asyncio.Queue[list[Batch] | None]] = [
            asyncio.Queue() for _ in range(self.lanes)
        ]
        self._stop_now = asyncio.Event()
        self.inbox: SimpleQueue[list[list[Batch]] | None] = SimpleQueue()
        self._done: list[Finished] = []  # finished by the lanes, for the acker
        self._hand_over_soon = False
        self.thread = threading.Thread(target=self._run_loop, name="dp-async", daemon=True)
        self.feeder = threading.Thread(target=self._feed, name="dp-async-feed", daemon=True)
        if self.batch:
            self._run = self._run_batch  # type: ignore[method-assign]

    def start(self) -> None:
        self.thread.start()
        self.feeder.start()

    def stop(self, timeout: float) -> None:
        """Let every lane finish what it holds (retries stop waiting), then end the loop."""
        self.inbox.put(None)
        self.thread.join(timeout)
        if not self.thread.is_alive():
            self.loop.close()

    def submit(self, per_lane: list[list[Batch]]) -> None:
        # A plain queue put: waking the loop costs a socket write, which releases the GIL
        # and would stall the reader behind busy threads. The feeder thread pays that.
        self.inbox.put(per_lane)

    def _feed(self) -> None:
        """Move what the reader submitted into the loop, one hop for all that piled up."""
        while True:
            items = [self.inbox.get()]
            while True:
                try:
                    items.append(self.inbox.get_nowait())
                except Empty:
                    break
            self.loop.call_soon_threadsafe(self._accept, items)
            if None in items:
                return

    def _accept(self, items: list[list[list[Batch]] | None]) -> None:
        for per_lane in items:
            if per_lane is None:
                self._close()
                return
            for q, batches in zip(self.queues, per_lane, strict=True):
                if batches:
                    q.put_nowait(batches)

    def _close(self) -> None:
        self._stop_now.set()
        for q in self.queues:
            q.put_nowait(None)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        await asyncio.gather(*(self._lane(q) for q in self.queues))
        self._hand_over()
        await self.loop.shutdown_default_executor()  # the helper threads of to_thread

    async def _lane(self, q: asyncio.Queue[list[Batch] | None]) -> None:
        while (batches := await q.get()) is not None:
            for batch in batches:
                try:
                    finished = await self._run(batch)
                except Exception as exc:
                    self.failed_batch(batch, exc)
                    finished = Finished(batch.shard, settled=len(batch.messages))
                self._done.append(finished)
                if not self._hand_over_soon:
                    # One hand-over to the acker per turn of the loop, for all lanes that ran
                    # (a batch whose handlers await hands the ones before it over meanwhile).
                    self._hand_over_soon = True
                    self.loop.call_soon(self._hand_over)

    def _hand_over(self) -> None:
        self._hand_over_soon = False
        if self._done:
            done, self._done = self._done, []
            self.acker.put(done)

    async def _run(self, batch: Batch) -> Finished:
        if self.ack_before:
            return await self._run_ack_before(batch)
        st, msgs = batch.shard, batch.messages
        tally = Tally()
        done, handler, max_deliveries = tally.ids, self.handler, self.retry.cfg.max_deliveries
        for i, msg in enumerate(msgs):
            status = st.status  # the per-message path, as in ThreadWorkers._run
            if status is not ACTIVE and status is not RECOVERING:
                outcome = Outcome.STOP
            elif msg.delivery_count > max_deliveries:
                outcome = await asyncio.to_thread(self.retry.dead_letter_unrun, st, msg)
            else:
                try:
                    await handler(msg)
                    done.append(msg.id)
                    continue
                except Exception as exc:
                    outcome = await self._retry(st, msg, exc, ack=True)
            if not tally.add(msg, outcome, len(msgs) - i):
                break
        return Finished(st, tally.ids, tally.settled)

    async def _run_batch(self, batch: Batch) -> Finished:
        """An ``async def`` batch handler: as ThreadWorkers._run_batch, awaited."""
        st, msgs = batch.shard, batch.messages
        tally, ack, retry = Tally(), not self.ack_before, self.retry
        if self.ack_before:
            ids = [m.id for m in msgs]
            if not st.handling or await asyncio.to_thread(self.fenced.ack_now, st, ids) == -1:
                return Finished(st, settled=len(msgs))
        todo = msgs
        if any(m.delivery_count > retry.cfg.max_deliveries for m in msgs):
            todo = await asyncio.to_thread(retry.batch_runnable, st, msgs, tally, ack=ack)
        backoff = retry.backoff()
        while todo:
            if not st.handling:
                tally.settled += len(todo)
                break
            try:
                await self.handler(list(todo))  # type: ignore[arg-type]
                failed: dict[str, Exception] = {}
            except BatchItemsFailed as partial:
                failed = partial.failed
            except Exception as exc:
                failed = dict.fromkeys((m.id for m in todo), exc)
            if failed:
                todo = await asyncio.to_thread(
                    retry.batch_failures, st, todo, failed, tally, ack=ack
                )
            else:
                todo = retry.batch_failures(st, todo, failed, tally, ack=ack)  # no Redis call
            if todo and (
                await self._stopped_within(backoff.next()) or not retry.again_all(st, todo)
            ):
                tally.settled += len(todo)
                break
        if self.ack_before:
            return Finished(st, settled=len(msgs))
        return Finished(st, tally.ids, tally.settled)

    async def _run_ack_before(self, batch: Batch) -> Finished:
        st, msgs = batch.shard, batch.messages
        ids = [m.id for m in msgs]
        if st.handling and await asyncio.to_thread(self.fenced.ack_now, st, ids) != -1:
            for msg in msgs:
                try:
                    await self.handler(msg)
                except Exception as exc:
                    await self._retry(st, msg, exc, ack=False)
        return Finished(st, settled=len(msgs))

    async def _retry(self, st: ShardState, msg: Message, exc: Exception, *, ack: bool) -> Outcome:
        backoff = self.retry.backoff()
        failed = self.retry.failed
        while (outcome := await asyncio.to_thread(failed, st, msg, exc, ack=ack)) is None:
            if await self._stopped_within(backoff.next()) or not self.retry.again(st, msg):
                return Outcome.STOP
            try:
                await self.handler(msg)
                return Outcome.ACK
            except Exception as again:
                exc = again
        return outcome

    async def _stopped_within(self, delay: float) -> bool:
        try:
            await asyncio.wait_for(self._stop_now.wait(), delay)
        except TimeoutError:
            return self.stopping.is_set()
        return True
