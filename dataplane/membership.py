"""The member's heartbeat state machine (PROTOCOL.md §1 C1–C6, §3, §4).

Pure: no I/O, no clocks, no threads. The caller passes ``now_ms`` in, sends the request that
:meth:`Membership.poll` returns, feeds the answer to :meth:`Membership.on_response` (or
:meth:`Membership.on_failure`) and applies the returned :class:`Actions` to the runtime. The
runtime reports back with :meth:`revocation_finished` (in-flight count reached 0) and
:meth:`shard_drained`. Keeping the machine pure is what makes C1–C6 testable from recorded
responses, without a coordinator or Redis.
"""

from __future__ import annotations

import logging
from typing import Any

from .backoff import Backoff
from .heartbeat import Actions, Grant, heartbeat_request, held_metadata
from .protocol import (
    FENCING_ERRORS,
    JOIN_EPOCH,
    LEAVE_EPOCH,
    TEMPORARY_LEAVE_EPOCH,
    ErrorCode,
    InstanceReplaced,
    RevokeState,
    Status,
    instance_replaced_answer,
)
from .reconcile import (
    answer_assignment,
    c1_stop_missing,
    c2_c3_take_new,
    r5_forget_processed_revoked,
    revoked_never_held,
)

__all__ = ["Actions", "Grant", "Membership"]

log = logging.getLogger(__name__)


class Membership:
    """The member's pure heartbeat state machine (C1–C6): :meth:`poll` the next request, feed
    the answer to :meth:`on_response` / :meth:`on_failure`, apply the returned Actions."""

    def __init__(
        self,
        member_id: str,
        *,
        client_id: str | None = None,
        rebalance_timeout_ms: int | None = None,
        heartbeat_interval_ms: int = 3000,
        session_timeout_ms: int = 30000,
        retry_backoff_ms: int = 200,
        retry_backoff_max_ms: int = 5000,
        instance_id: str | None = None,
    ) -> None:
        self.member_id = member_id
        self.instance_id = instance_id  # §9: sent on every request; leaving sends -2, not -1
        self.client_id = client_id
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.session_timeout_ms = session_timeout_ms
        # No jitter: the machine runs on the caller's clock and its tests replay exact times.
        self._retry = Backoff(retry_backoff_ms, retry_backoff_max_ms, jitter=False)

        self.member_epoch = JOIN_EPOCH
        self.metadata: dict[str, Any] | None = None
        self.metadata_epoch = 0
        self.owned: dict[str, Grant] = {}
        self.revoking: dict[str, RevokeState] = {}  # until an answer accepted REVOKED
        self.drained: set[str] = set()
        self.leaving = False
        self.left = False
        self.last_status: str | None = None
        self.last_error: str | None = None
        self.replaced: InstanceReplaced | None = None  # R1s: a newer process took our instanceId
        # §11: the last accepted answer was PAUSED: the runtime reads nothing (no new entries,
        # no pending recovery) until an answer with another status; ownership is kept.
        self.paused = False

        self._in_flight: dict[str, Any] | None = None
        self._last_accepted_ms: int | None = None
        self._next_due_ms: int | None = None  # None = send at the first poll
        self._urgent = True  # joining
        self._fences = 0  # fences since the last accepted heartbeat
        self._asking = False  # fenced itself: ask at its epoch before rejoining (_fence)
        self._resume = False  # while asking: an OK answer resumes instead of rejoining

    # ---- views ---------------------------------------------------------------------------

    @property
    def readable(self) -> dict[str, Grant]:
        """Shards the runtime may read now (none while the group is paused, §11)."""
        return {} if self.paused else dict(self.owned)

    @property
    def revoking_in_progress(self) -> list[str]:
        return sorted(s for s, st in self.revoking.items() if st == RevokeState.REVOKING)

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def next_wakeup_ms(self, now_ms: int) -> int:
        """Milliseconds until :meth:`poll` may return a request (0 = now)."""
        if self.left or self._in_flight is not None:
            return self.heartbeat_interval_ms
        if self._due_now():
            return 0
        return max(0, (self._next_due_ms or now_ms) - now_ms)

    # ---- requests ------------------------------------------------------------------------

    def _due_now(self) -> bool:
        if self._retry.failures:
            return False  # backing off: wait for _next_due_ms even if urgent
        if self.member_epoch == JOIN_EPOCH or self._urgent:
            return True
        return self.leaving and not self.revoking_in_progress

    def poll(self, now_ms: int) -> dict[str, Any] | None:
        """The next heartbeat request, or None. At most one request is in flight."""
        if self.left or self._in_flight is not None:
            return None
        if self.leaving and self.member_epoch == JOIN_EPOCH:
            self.left = True  # never joined (or fenced): nothing to leave
            return None
        due = self._due_now() or (self._next_due_ms is not None and now_ms >= self._next_due_ms)
        if not due and self._next_due_ms is None:
            due = True
        if not due:
            return None
        leave_epoch = TEMPORARY_LEAVE_EPOCH if self.instance_id else LEAVE_EPOCH
        epoch = leave_epoch if self.leaving and not self.revoking_in_progress else self.member_epoch
        req = heartbeat_request(self.member_id, epoch, self.metadata_epoch, self.owned,
                                self.revoking, self.drained, client_id=self.client_id,
                                instance_id=self.instance_id,
                                rebalance_timeout_ms=self.rebalance_timeout_ms)  # fmt: skip
        self._in_flight = req
        self._urgent = False
        return req

    # ---- responses -----------------------------------------------------------------------

    def on_failure(self, now_ms: int, error: str = "transport") -> Actions:
        """The request got no answer. Keep state; retry after a backoff (R3 covers the case
        where the coordinator applied it and only the answer was lost)."""
        self._in_flight = None
        self.last_error = error
        self._backoff(now_ms)
        return Actions()

    def on_response(self, now_ms: int, http_status: int, body: dict[str, Any]) -> Actions:
        req = self._in_flight
        self._in_flight = None
        if req is None:
            log.warning("heartbeat response without a request in flight: ignored")
            return Actions()
        if req["memberEpoch"] < JOIN_EPOCH:  # -1, or -2 for a static member
            self.left = True  # whatever the answer: we are gone, and R2 makes it idempotent
            return Actions(left=True)
        code = body.get("errorCode") or ErrorCode.NONE
        self.last_error = None if code == ErrorCode.NONE else code
        asking, self._asking = self._asking, False
        resume, self._resume = self._resume, False
        if http_status == 200 and code == ErrorCode.NONE:
            if asking and not resume:  # not replaced; our grants' tokens are past: rejoin anyway
                return self._fence(now_ms, "still a member after fencing itself")
            if asking:
                log.warning("member %s still in the group at epoch %s after its session lapsed "
                            "locally: resuming its assignment, no rejoin", self.member_id,
                            req["memberEpoch"])  # fmt: skip
            return self._accept(now_ms, req, body)
        if code in FENCING_ERRORS:
            if self.instance_id and not self.leaving:  # fatal, like Kafka's FENCED_INSTANCE_ID
                self.replaced = instance_replaced_answer(body)
            return self._fence(now_ms, f"{code}: {body.get('errorMessage')}")
        # INVALID_REQUEST, auth, GROUP_ID_NOT_FOUND, GROUP_MAX_SIZE_REACHED, ...: keep what we
        # hold and retry; check_session() stops everything past the session timeout. (Before
        # the first join auth and unknown group are fatal: errors.heartbeat_refusal.)
        msg = body.get("errorMessage")
        log.warning("heartbeat refused: HTTP %s %s: %s (retrying)", http_status, code, msg)
        self._asking, self._resume = asking, resume
        self._backoff(now_ms)
        return Actions()

    def _accept(self, now_ms: int, req: dict[str, Any], body: dict[str, Any]) -> Actions:
        epoch = body.get("memberEpoch")
        sent_epoch = req["memberEpoch"]
        if body.get("memberId") not in (None, self.member_id):
            return self._fence(now_ms, "memberId mismatch")
        if not isinstance(epoch, int) or epoch < 1 or (sent_epoch > 0 and epoch < sent_epoch):
            return self._fence(now_ms, f"member epoch mismatch ({sent_epoch} -> {epoch})")
        if sent_epoch == JOIN_EPOCH:
            again = "rejoined" if self._fences else "joined"
            log.info("member %s %s at epoch %s", self.member_id, again, epoch)
        self._retry.reset()
        self._fences = 0
        self._last_accepted_ms = now_ms
        self.member_epoch = epoch
        status = body.get("status") or Status.OK
        self.last_status = status
        interval = body.get("heartbeatIntervalMs")
        if isinstance(interval, int) and interval > 0:
            self.heartbeat_interval_ms = interval
        held = held_metadata(body.get("metadata"), self.metadata, self.metadata_epoch)
        self.metadata, self.metadata_epoch = held.metadata, held.epoch
        self.heartbeat_interval_ms = held.heartbeat_interval_ms or self.heartbeat_interval_ms
        self.session_timeout_ms = held.session_timeout_ms or self.session_timeout_ms

        assigned, coord_revoking = answer_assignment(body)
        actions = Actions()
        c1_stop_missing(self.owned, self.revoking, assigned, actions)
        if revoked_never_held(self.owned, self.revoking, coord_revoking):
            self._urgent = True
        r5_forget_processed_revoked(self.revoking, req.get("revokingShards") or [], coord_revoking)
        if status == Status.PAUSED and not self.paused:
            msg = "group paused: member %s finishes in-flight work, then reads nothing"
            log.info(msg, self.member_id)
        elif self.paused and status != Status.PAUSED:
            log.info("group resumed: member %s reads again", self.member_id)
        self.paused = status == Status.PAUSED
        # C2 on OK; §11: a shard granted while paused is owned too, and read after the resume.
        # Any other status (SYNC_METADATA, REVOKE_PENDING, one this library does not know) is
        # drain-only (C3): nothing new is taken.
        if status in (Status.OK, Status.PAUSED) and not self.leaving:
            c2_c3_take_new(self.owned, self.revoking, assigned, actions, metadata=self.metadata,
                           epoch=epoch, member_id=self.member_id)  # fmt: skip
        self.drained &= set(self.owned) | set(self.revoking)
        self._next_due_ms = now_ms + self.heartbeat_interval_ms
        return actions

    # ---- fencing, timers -----------------------------------------------------------------

    def _fence(
        self, now_ms: int, reason: str, *, ask: bool = False, resume: bool = False
    ) -> Actions:
        """C4/C5: stop reading and acking everything, forget ownership, rejoin at epoch 0; stop
        for good when a newer incarnation of our instanceId replaced us (R1s). ``ask``: fenced
        by itself (token taken, session lapsed), a static member's join could replace that newer
        process, so it first heartbeats at its epoch holding nothing: the answer decides.
        ``resume`` (session lapsed, any member, issue 27.11): the coordinator may have been the
        one that was down and expired nobody; an OK answer to that ask resumes the assignment
        (grants taken again at the answer's epoch; the fence tokens still guard each shard)
        instead of a group-wide rejoin. A fencing answer still rejoins."""
        stopped = sorted(set(self.owned) | set(self.revoking))
        ask = ask and (bool(self.instance_id) or resume)
        ask = ask and self.member_epoch > 0 and not self.leaving
        then = "stopping" if self.replaced else "asking the coordinator" if ask else "rejoining"
        log.log(logging.ERROR if self.replaced else logging.WARNING, "member %s fenced (%s):"
                " aborting %d shards, %s", self.member_id, reason, len(stopped), then)  # fmt: skip
        self.last_error = reason
        self.owned.clear()
        self.revoking.clear()
        self.drained.clear()
        if ask:
            self._asking = self._urgent = True
            self._resume = resume
            self._last_accepted_ms = None  # no second session check while asking
            return Actions(abort=stopped)
        self.member_epoch = JOIN_EPOCH
        if self.leaving or self.replaced:
            self.left = True  # nothing left to leave: the coordinator no longer holds us
            return Actions(abort=stopped, left=True)
        # Rejoin at once, but not in a tight loop if the coordinator keeps fencing the joins.
        self._fences += 1
        if self._fences > 1:
            self._backoff(now_ms)
        else:
            self._retry.reset()
        self._urgent = True
        return Actions(abort=stopped, rejoin=True)

    def fence_locally(self, now_ms: int, shards: set[str], reason: str) -> Actions:
        """The runtime found ownership it cannot prove (fence token taken by a higher grant).
        Shards we no longer hold (already aborted by a fence, e.g. the session check a moment
        before a refused ACK) are not a new loss: fencing again would only delay the rejoin."""
        if not shards & (set(self.owned) | set(self.revoking)):
            log.debug("fence token taken on %s, which we no longer hold", sorted(shards))
            return Actions()
        return self._fence(now_ms, reason, ask=True)

    def check_session(self, now_ms: int) -> Actions:
        """No accepted heartbeat for a session timeout: the coordinator has expired us (L1),
        so our shards may already be someone else's. Stop before it can matter."""
        if (
            self.member_epoch > 0
            and self._in_flight is None
            and self._last_accepted_ms is not None
            and now_ms - self._last_accepted_ms > self.session_timeout_ms
        ):
            self._last_accepted_ms = None
            return self._fence(
                now_ms, "session timeout without an accepted heartbeat", ask=True, resume=True
            )
        return Actions()

    def _backoff(self, now_ms: int) -> None:
        self._next_due_ms = now_ms + int(self._retry.next())

    # ---- runtime feedback ----------------------------------------------------------------

    def revocation_finished(self, shard: str) -> None:
        """The runtime's in-flight count of a revoking shard reached 0 (C1)."""
        if self.revoking.get(shard) == RevokeState.REVOKING:
            self.revoking[shard] = RevokeState.REVOKED
            self._urgent = True  # report it now: the shard's next owner is waiting

    def shard_drained(self, shard: str) -> None:
        """A sealed shard was read to the end with an empty pending list (§6.3)."""
        if shard in self.owned or shard in self.revoking:
            self.drained.add(shard)

    def leave(self) -> Actions:
        """Start leaving: stop reading every shard; once none is in flight, send epoch -1."""
        if self.leaving:
            return Actions()
        self.leaving = True
        actions = Actions()
        for shard in sorted(self.owned):
            self.revoking[shard] = RevokeState.REVOKING
            actions.revoke.append(shard)
        self.owned.clear()
        return actions

    def decline(self, shards: list[str]) -> None:
        """The driver did not start these new grants (its Redis is not the coordinator's, issue
        25.4): forget them unread, so that the leave that follows reports nothing of them."""
        for shard in shards:
            self.owned.pop(shard, None)

    def force_leave(self) -> None:
        """Leave now even though some shards are still in flight (shutdown deadline)."""
        self.leaving = True
        for shard, state in list(self.revoking.items()):
            if state == RevokeState.REVOKING:
                self.revoking[shard] = RevokeState.REVOKED
