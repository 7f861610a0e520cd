"""Group commit: a process's locked heartbeats of one group share one locked pass.

A group's locked passes run one at a time (its row lock; this process's gate). While one runs,
the process's other locked heartbeats of the group queue; the next pass applies every queued
one (up to `BATCH_MAX`), in arrival order, to the one state it loaded, then saves and commits
once: exactly what the same heartbeats would do in passes of their own, one after the other,
with one lock, one load, one write batch and one commit for all (decision 0003). A join storm
is a queue of hundreds of joins, then of hundreds of heartbeats collecting their grants
(Kafka's coordinator, single-threaded per group, works the same way).

A request may be dropped wherever it waits: the request deadline (coordinator_project.
wsgi_guard) is a BaseException raised into it (decision 0016). Each heartbeat here is in one of
three places, and a drop is handled in each so that a client's answer is always true:
- queued (waiting for the gate): it leaves the queue, so no later pass applies it, and its
  client is answered "not applied" (503);
- taken into a running pass's batch: the pass decides. The dropped request waits for that
  pass to end (it ends within the pass holder's own deadline) and answers what the pass did:
  its result if the pass committed, else "not applied". So a heartbeat is never applied
  while its client is told it was not (R3/R9 rest on the member knowing its assignment);
- the pass's holder itself: the pass is rolled back (its transaction never commits), its
  batch is handed back, and each heartbeat of it that is still within its own deadline is
  applied by a later pass.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar

from django.db import InterfaceError, OperationalError

from assignments.gates import group_gate
from coordination.model import HeartbeatRequest
from coordinator_project import waiting
from coordinator_project.process_state import ProcessCache

BATCH_MAX = 64
# How long a request dropped while its heartbeat is in a running pass waits for that pass to
# end. The pass ends within its holder's deadline (REQUEST_DEADLINE_SECONDS, 5 s); this only
# bounds the wait should a pass hang without one (a sync worker has no deadline and no
# concurrency, so never gets here).
PASS_OUTCOME_WAIT_S = 30.0

R = TypeVar("R")


@dataclass(eq=False)
class Queued(Generic[R]):
    """One locked heartbeat in the group-commit queue."""

    req: HeartbeatRequest
    now: datetime | None
    result: R | None = None
    error: BaseException | None = None
    # Set while a pass holds it in its batch: the event is set when that pass has ended
    # (committed, failed or dropped).
    in_pass: threading.Event | None = field(default=None, repr=False)


class GroupCommit(Generic[R]):
    """The group-commit queue of this process. `run_pass(group, batch)` is one locked pass
    (the gate is held): it sets each heartbeat's `result`, and only once its commit succeeded;
    it raises when the pass failed."""

    def __init__(self, run_pass: Callable[[str, list[Queued[R]]], None],
                 queues: ProcessCache[str, deque[Queued[R]]], batch_max: int = BATCH_MAX) -> None:
        self._run_pass = run_pass
        self._queues = queues
        self.batch_max = batch_max

    def queued(self, group: str) -> int:
        """This process's heartbeats of `group` waiting for a pass."""
        return len(self._queues.get(group, ()))

    def apply(self, group: str, req: HeartbeatRequest, now: datetime | None) -> R:
        """Apply one locked heartbeat, in this process's next pass of its group."""
        mine: Queued[R] = Queued(req, now)
        queue = self._queues.setdefault(group, deque())
        queue.append(mine)
        try:
            with group_gate(group):
                if mine.result is None and mine.error is None:  # no pass applied it while it waited
                    self._lead(group, queue, mine)
        except BaseException:
            outcome = self._dropped(queue, mine)
            if outcome is None:
                raise
            return outcome
        if mine.error is not None:
            raise mine.error
        assert mine.result is not None  # noqa: S101 - every pass answers each of its batch or raises
        return mine.result

    def _lead(self, group: str, queue: deque[Queued[R]], mine: Queued[R]) -> None:
        batch = [mine]
        while queue and len(batch) < self.batch_max:
            queued = queue.popleft()
            if queued is not mine:
                batch.append(queued)
        with suppress(ValueError):
            queue.remove(mine)  # in the queue still if a full batch left it there
        over = threading.Event()
        for queued in batch:
            queued.in_pass = over
        try:
            self._apply_batch(group, batch)
        finally:
            for queued in batch:
                queued.in_pass = None
            over.set()  # the taken ones that were dropped meanwhile learn the outcome

    def _dropped(self, queue: deque[Queued[R]], mine: Queued[R]) -> R | None:
        """`mine`'s request was dropped (a BaseException where it waited): its result if a pass
        applied it (its client must learn it), else None after making sure none will."""
        over = mine.in_pass
        if over is not None and mine.result is None:
            waiting.wait(over, PASS_OUTCOME_WAIT_S)  # in a running pass: that pass decides
        if mine.result is not None:
            return mine.result
        with suppress(ValueError):
            queue.remove(mine)  # still queued: no later pass may apply it
        return None

    def _apply_batch(self, group: str, batch: list[Queued[R]]) -> None:
        """Apply `batch` in one pass; if that fails, each heartbeat in a pass of its own, so one
        that fails (a bug, a row the database refuses) fails alone. Not when the database is
        unavailable: that fails them all at once (503, the members retry), as their own passes
        would, instead of each waiting out the pool's timeout in turn while holding the gate."""
        try:
            self._run_pass(group, batch)
            return
        except (OperationalError, InterfaceError) as exc:
            for queued in batch:
                queued.error = exc
            return
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
                return
        for queued in batch:
            try:
                self._run_pass(group, [queued])
            except Exception as exc:
                queued.error = exc
