"""The shard table: what the runtime's threads share, behind the one lock.

Per granted shard a :class:`ShardState` (its status, recovery cursor, in-flight count); for
the whole runtime the control operations not yet applied by the reader, the shards an
outstanding read covers, the drained and lost sets, and the total in flight that bounds reads.
Every other part (reader, recovery, workers, acker) reads and changes shared state only
through this table, so the locking lives in one place.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum, StrEnum

from ..membership import Grant
from ..routing import ShardKeys


class ShardStatus(StrEnum):
    STARTING = "STARTING"  # fence token + group creation pending
    RECOVERING = "RECOVERING"  # re-dispatching pending entries before new reads
    ACTIVE = "ACTIVE"
    REVOKING = "REVOKING"  # no new reads; finish the message in progress, ACK, then done
    ABORTED = "ABORTED"  # fenced: no new reads, no ACKs
    LOST = "LOST"  # our fence token was overtaken: we are stale for this shard


READING = frozenset({ShardStatus.STARTING, ShardStatus.RECOVERING, ShardStatus.ACTIVE})
HANDLING = frozenset({ShardStatus.RECOVERING, ShardStatus.ACTIVE})  # handlers may run
FINAL = frozenset({ShardStatus.ABORTED, ShardStatus.LOST})  # no ACKs any more


class RecoveryPhase(Enum):
    CLAIM = "claim"  # claim others' pending entries to us
    OWN = "own"  # read our whole PEL in ID order


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
        self.status = ShardStatus.STARTING
        self.in_flight = 0
        self.last_id = "0"  # the highest id dispatched: re-reads of our PEL start after it
        self.phase = RecoveryPhase.CLAIM
        self.claim_cursor = "0-0"
        self.next_sweep = 0.0

    @property
    def shard(self) -> str:
        return self.grant.shard

    @property
    def reading(self) -> bool:
        return self.status in READING

    @property
    def handling(self) -> bool:
        return self.status in HANDLING


@dataclass(frozen=True, slots=True)
class StartShard:
    """Control op: raise the fence token, create the group, then recover and read."""

    grant: Grant

    @property
    def shard(self) -> str:
        return self.grant.shard


@dataclass(frozen=True, slots=True)
class StopShard:
    """Control op: the shard stops reading (REVOKING or ABORTED), after any queued start."""

    shard: str
    status: ShardStatus


ControlOp = StartShard | StopShard


class ShardTable:
    def __init__(self, max_in_flight: int) -> None:
        self.lock = threading.Lock()
        self.capacity = threading.Condition(self.lock)  # notified when in-flight drops
        self.changed = threading.Event()  # set when in-flight drops or drained/lost change
        self.max_in_flight = max_in_flight
        self.total_in_flight = 0
        self._shards: dict[str, ShardState] = {}
        self._by_stream: dict[str, ShardState] = {}
        self._reading_now: frozenset[str] = frozenset()
        self._control: deque[ControlOp] = deque()
        self._queued: dict[str, int] = defaultdict(int)  # control ops not yet applied
        self._drained: set[str] = set()
        self._lost: set[str] = set()
        self.fatal: BaseException | None = None  # first error no retry can heal (fail())

    # ---- control ops (the seam queues them, the reader applies them) -------------------------

    def enqueue(self, op: ControlOp) -> None:
        with self.lock:
            if isinstance(op, StopShard):
                st = self._shards.get(op.shard)
                if st is not None and st.status not in FINAL:
                    st.status = op.status  # at once: workers stop handling this shard
                self._drained.discard(op.shard)
            self._queued[op.shard] += 1
            self._control.append(op)

    def has_control(self) -> bool:
        return bool(self._control)

    def next_control(self) -> ControlOp | None:
        with self.lock:
            return self._control[0] if self._control else None

    def control_done(self, op: ControlOp) -> None:
        with self.lock:
            self._control.popleft()
            self._queued[op.shard] -= 1
            if self._queued[op.shard] <= 0:
                del self._queued[op.shard]
        self.changed.set()

    def apply_stop(self, op: StopShard) -> None:
        with self.lock:
            st = self._shards.get(op.shard)
            if st is not None and st.status not in FINAL:
                st.status = op.status

    def install(self, grant: Grant) -> ShardState:
        """A fresh state for a (re)granted shard; a regrant under the same token keeps the
        position we dispatched up to."""
        with self.lock:
            old = self._shards.get(grant.shard)
            st = ShardState(grant)
            if old is not None and old.last_id != "0" and old.token == grant.token:
                st.last_id = old.last_id
            self._shards[grant.shard] = st
            self._by_stream[st.stream] = st
            self._drained.discard(grant.shard)
            return st

    # ---- status --------------------------------------------------------------------------

    def get(self, shard: str) -> ShardState | None:
        with self.lock:
            return self._shards.get(shard)

    def by_stream(self, stream: str) -> ShardState | None:
        return self._by_stream.get(stream)

    def status(self, shard: str) -> ShardStatus | None:
        with self.lock:
            st = self._shards.get(shard)
            return st.status if st else None

    def with_status(self, *statuses: ShardStatus) -> list[ShardState]:
        with self.lock:
            return [s for s in self._shards.values() if s.status in statuses]

    def advance(self, st: ShardState, frm: ShardStatus, to: ShardStatus) -> None:
        with self.lock:
            if st.status == frm:
                st.status = to

    def reread_own_pending(self, shards: Iterable[ShardState]) -> None:
        """After a failed read the entries of the lost reply are in our PEL already: re-read
        it from the last id dispatched before reading new entries again."""
        with self.lock:
            for st in shards:
                if st.status == ShardStatus.ACTIVE:
                    st.status, st.phase = ShardStatus.RECOVERING, RecoveryPhase.OWN
            self._reading_now = frozenset()

    def fail(self, exc: BaseException) -> None:
        """Record an error no retry heals (a Redis ACL refusal): the driver stops on it."""
        with self.lock:
            if self.fatal is None:
                self.fatal = exc
        self.changed.set()

    def mark_lost(self, st: ShardState) -> None:
        with self.lock:
            if st.status == ShardStatus.ABORTED or self._shards.get(st.shard) is not st:
                # A late refusal for a grant we already gave up (C4) or that a newer grant
                # replaced: nothing we hold now is lost, so it must not fence us again.
                return
            st.status = ShardStatus.LOST
            self._lost.add(st.shard)
        self.changed.set()

    def pop_lost(self) -> set[str]:
        """Shards found lost since the last call (an event: each is reported once)."""
        with self.lock:
            lost, self._lost = self._lost, set()
            return lost

    def mark_drained(self, shards: Iterable[ShardState]) -> set[str]:
        """Record drained shards (still ACTIVE); returns the newly drained ones."""
        with self.lock:
            new = {s.shard for s in shards if s.status == ShardStatus.ACTIVE} - self._drained
            self._drained |= new
        if new:
            self.changed.set()
        return new

    def drained_shards(self) -> set[str]:
        """Shards currently drained (a state: a shard stays in it until stopped)."""
        with self.lock:
            return set(self._drained)

    def forget(self, shard: str) -> None:
        with self.lock:
            st = self._shards.get(shard)
            if st is not None and not st.reading and st.in_flight == 0:
                del self._shards[shard]
                self._by_stream.pop(st.stream, None)

    # ---- in-flight accounting ------------------------------------------------------------

    def in_flight(self, shard: str) -> int:
        """Messages of the shard read but not finished, plus one while a read that covers it
        is outstanding (the entries it delivers land in our PEL)."""
        with self.lock:
            st = self._shards.get(shard)
            n = st.in_flight if st is not None else 0
            return n + (1 if shard in self._reading_now else 0)

    def queued_ops(self, shard: str) -> int:
        with self.lock:
            return self._queued.get(shard, 0)

    def begin_read(self, shards: Iterable[ShardState]) -> None:
        with self.lock:
            self._reading_now = frozenset(s.shard for s in shards)

    def end_read(self) -> None:
        with self.lock:
            self._reading_now = frozenset()
        self.changed.set()

    def reads_idle(self, shards: set[str]) -> bool:
        with self.lock:
            return not (shards & self._reading_now or any(self._queued.get(s) for s in shards))

    def add(self, st: ShardState, n: int, last_id: str | None) -> None:
        with self.lock:
            st.in_flight += n
            self.total_in_flight += n
            if last_id is not None:
                st.last_id = last_id

    def finish(self, counts: dict[ShardState, int]) -> None:
        with self.capacity:
            for st, n in counts.items():
                st.in_flight -= n
                self.total_in_flight -= n
            self.capacity.notify_all()
        self.changed.set()

    def wait_capacity(self, stopping: threading.Event) -> bool:
        """Block while the runtime holds max_in_flight messages; False when a control op or
        a stop needs the reader's attention first."""
        with self.capacity:
            while self.total_in_flight >= self.max_in_flight:
                if stopping.is_set() or self._control:
                    return False
                self.capacity.wait(0.1)
        return True
