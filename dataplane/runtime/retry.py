"""Handler retries and the DLQ step, shared by the thread and the coroutine workers.

A failed handler is run again in place, with backoff, until it succeeds, the message has
been delivered ``max_deliveries`` times (then one fenced script moves it to the shard's DLQ
stream and ACKs it) or the shard stops handling. Running in place keeps per-key order: the
later messages of the key wait behind it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .. import scripts
from ..backoff import Backoff
from ..message import Message
from .acker import Fenced
from .config import RuntimeConfig
from .shard_table import ShardState

log = logging.getLogger(__name__)


class Outcome(Enum):
    ACK = "ack"  # handled: the acker ACKs it
    DLQ = "dlq"  # moved to the DLQ (and ACKed by that script)
    STOP = "stop"  # the shard stopped (or the runtime): left pending for the next owner


@dataclass(slots=True)
class Tally:
    """What a batch came to: IDs for the acker, and the messages settled otherwise."""

    ids: list[str] = field(default_factory=list)
    settled: int = 0

    def add(self, msg: Message, outcome: Outcome, remaining: int) -> bool:
        """Count one message's outcome; False when the rest of the batch must be left."""
        if outcome is Outcome.ACK:
            self.ids.append(msg.id)
        elif outcome is Outcome.DLQ:
            self.settled += 1
        else:  # left pending for the next owner (or our own recovery), with the rest
            self.settled += remaining
            return False
        return True


class Retry:
    def __init__(self, cfg: RuntimeConfig, fenced: Fenced, metrics: Any = None) -> None:
        self.cfg = cfg
        self.fenced = fenced
        self.metrics = metrics  # dataplane.metrics.Metrics or None

    def backoff(self) -> Backoff:
        return Backoff(self.cfg.retry_backoff_ms / 1000, self.cfg.retry_backoff_max_ms / 1000)

    def dead_letter_unrun(self, st: ShardState, msg: Message) -> Outcome:
        """A message that came back more often than allowed before running (e.g. it crashed
        the process) goes to the DLQ without running again."""
        self.dead_letter(st, msg, "max deliveries exceeded before handling", ack=True)
        return Outcome.DLQ

    def failed(self, st: ShardState, msg: Message, exc: Exception, *, ack: bool) -> Outcome | None:
        """The handler raised: DLQ when this was the last delivery allowed, else None (wait
        the backoff, then :meth:`again`)."""
        if msg.delivery_count >= self.cfg.max_deliveries:
            self.dead_letter(st, msg, f"{type(exc).__name__}: {exc}", ack=ack)
            return Outcome.DLQ
        log.debug(
            "handler failed on %s %s (delivery %d): %r", st.shard, msg.id, msg.delivery_count, exc
        )
        return None

    def batch_runnable(
        self, st: ShardState, msgs: list[Message], tally: Tally, *, ack: bool
    ) -> list[Message]:
        """A batch's messages that may run; those delivered more often than allowed go to
        the DLQ unrun (as :meth:`dead_letter_unrun`)."""
        limit = self.cfg.max_deliveries
        if all(m.delivery_count <= limit for m in msgs):
            return msgs
        for m in msgs:
            if m.delivery_count > limit:
                self.dead_letter(st, m, "max deliveries exceeded before handling", ack=ack)
                tally.settled += 1
        return [m for m in msgs if m.delivery_count <= limit]

    def batch_failures(
        self,
        st: ShardState,
        todo: list[Message],
        failed: dict[str, Exception],
        tally: Tally,
        *,
        ack: bool,
    ) -> list[Message]:
        """One batch call's outcome: the messages not failed are handled (ACKed), a failed one
        on its last delivery goes to the DLQ; returns the ones to run again, in ID order."""
        again: list[Message] = []
        for m in todo:
            exc = failed.get(m.id)
            if exc is None:
                if ack:
                    tally.ids.append(m.id)
            elif self.failed(st, m, exc, ack=ack) is Outcome.DLQ:
                tally.settled += 1
            else:
                again.append(m)
        return again

    def again_all(self, st: ShardState, msgs: list[Message]) -> bool:
        """After the backoff, before a batch runs again: False when the shard stopped."""
        if not st.handling:
            return False
        for m in msgs:
            m.delivery_count += 1
        if self.metrics is not None:
            self.metrics.retried.labels(st.shard).inc(len(msgs))
        return True

    def again(self, st: ShardState, msg: Message) -> bool:
        """After the backoff: False when the shard stopped handling meanwhile."""
        if not st.handling:
            return False
        msg.delivery_count += 1
        if self.metrics is not None:
            self.metrics.retried.labels(st.shard).inc()
        return True

    def dead_letter(self, st: ShardState, msg: Message, error: str, *, ack: bool) -> None:
        """Move the message to the shard's DLQ stream (and ACK it unless ack="before" did)."""
        group = self.fenced.group
        args: list[Any] = [
            group, st.token, self.fenced.ack_mode, msg.id, "1" if ack else "0", self.cfg.dlq_maxlen,
            "dlq:error", error[:2000], "dlq:deliveries", msg.delivery_count, "dlq:id", msg.id,
            "dlq:shard", st.shard, "dlq:group", group,
        ]  # fmt: skip
        for k, v in msg.fields.items():
            args += (k, v)
        keys = [st.stream, st.keys.fence(group), st.keys.dlq(group)]
        res = self.fenced.call(lambda: scripts.dlq(self.fenced.client, keys, args), "DLQ move")
        if res == -1:
            self.fenced.table.mark_lost(st)
            return
        if self.metrics is not None:
            self.metrics.dead_lettered.labels(st.shard).inc()
        log.warning(
            "message %s of %s moved to %s after %d deliveries",
            msg.id, st.shard, keys[2], msg.delivery_count,
        )  # fmt: skip
