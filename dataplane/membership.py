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
from dataclasses import dataclass, field
from typing import Any

from .routing import DEFAULT_KEY_PREFIX, ShardKeys

log = logging.getLogger(__name__)

OK = "OK"
SYNC_METADATA = "SYNC_METADATA"
REVOKE_PENDING = "REVOKE_PENDING"
REVOKING = "REVOKING"
REVOKED = "REVOKED"
FENCING_ERRORS = frozenset({"UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH"})

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
TEMPORARY_LEAVE_EPOCH = -2  # static members (§9): shards stay reserved for the instance id


@dataclass(frozen=True, slots=True)
class Grant:
    """A shard the runtime may read, with what it needs to start reading it."""

    shard: str
    grant_epoch: int  # memberEpoch of the OK response that granted it
    member_id: str
    redis_key: str
    seal_key: str
    start_id: str  # consumer-group start: "0", or "$" for a first version with "latest"
    key_prefix: str = DEFAULT_KEY_PREFIX

    @property
    def token(self) -> str:
        """Fence token value: ``"grantEpoch:memberId"``; only the epoch is compared."""
        return f"{self.grant_epoch}:{self.member_id}"

    @property
    def keys(self) -> ShardKeys:
        return ShardKeys(self.shard, self.key_prefix)


@dataclass(slots=True)
class Actions:
    """What the runtime must do after a step of the machine."""

    grant: list[Grant] = field(default_factory=list)  # raise fence token, then read
    revoke: list[str] = field(default_factory=list)  # stop reads, finish and ACK in-flight (C1)
    abort: list[str] = field(default_factory=list)  # stop reads and ACKs at once (C4)
    rejoin: bool = False
    left: bool = False

    def __bool__(self) -> bool:
        return bool(self.grant or self.revoke or self.abort or self.rejoin or self.left)


def _shard_name(entry: Any) -> str:
    # assignment.revokingShards may list bare ids or {"shard": id, ...} objects.
    return entry["shard"] if isinstance(entry, dict) else str(entry)


class Membership:
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
        self._backoff_base = retry_backoff_ms
        self._backoff_max = retry_backoff_max_ms

        self.member_epoch = JOIN_EPOCH
        self.metadata: dict[str, Any] | None = None
        self.metadata_epoch = 0
        self.owned: dict[str, Grant] = {}
        self.revoking: dict[str, str] = {}  # shard -> REVOKING | REVOKED (until accepted)
        self.drained: set[str] = set()
        self.leaving = False
        self.left = False
        self.last_status: str | None = None
        self.last_error: str | None = None

        self._in_flight: dict[str, Any] | None = None
        self._last_sent_ms: int | None = None
        self._last_accepted_ms: int | None = None
        self._next_due_ms: int | None = None  # None = send at the first poll
        self._urgent = True  # joining
        self._failures = 0
        self._fences = 0

    # ---- views ---------------------------------------------------------------------------

    @property
    def readable(self) -> dict[str, Grant]:
        """Shards the runtime may read now."""
        return dict(self.owned)

    @property
    def revoking_in_progress(self) -> list[str]:
        return sorted(s for s, st in self.revoking.items() if st == REVOKING)

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
        if self._failures:
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
        req = self._build_request()
        self._in_flight = req
        self._last_sent_ms = now_ms
        self._urgent = False
        return req

    def _build_request(self) -> dict[str, Any]:
        leave = self.leaving and not self.revoking_in_progress
        leave_epoch = TEMPORARY_LEAVE_EPOCH if self.instance_id else LEAVE_EPOCH
        epoch = leave_epoch if leave else self.member_epoch
        req: dict[str, Any] = {"memberId": self.member_id, "memberEpoch": epoch}
        if self.client_id:
            req["clientId"] = self.client_id
        if self.instance_id:
            req["instanceId"] = self.instance_id
        if epoch == JOIN_EPOCH and self.rebalance_timeout_ms is not None:
            req["rebalanceTimeoutMs"] = self.rebalance_timeout_ms
        req["metadataEpoch"] = self.metadata_epoch
        if epoch <= JOIN_EPOCH:
            # C5: a join never reports ownership; a leave releases everything anyway.
            req["ownedShards"] = []
            req["revokingShards"] = []
            req["drainedShards"] = []
        else:
            req["ownedShards"] = sorted(self.owned)
            req["revokingShards"] = [
                {"shard": s, "state": st} for s, st in sorted(self.revoking.items())
            ]
            req["drainedShards"] = sorted(self.drained)
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
        code = body.get("errorCode") or "NONE"
        self.last_error = None if code == "NONE" else code
        if http_status == 200 and code == "NONE":
            return self._accept(now_ms, req, body)
        if code in FENCING_ERRORS:
            return self._fence(now_ms, code)
        # INVALID_REQUEST, auth, GROUP_ID_NOT_FOUND, GROUP_MAX_SIZE_REACHED, ...: nothing in the
        # contract tells the member to drop what it holds; retry later. If it stays like this
        # past the session timeout, check_session() stops everything.
        log.error("heartbeat refused: HTTP %s %s: %s", http_status, code, body.get("errorMessage"))
        self._backoff(now_ms)
        return Actions()

    def _accept(self, now_ms: int, req: dict[str, Any], body: dict[str, Any]) -> Actions:
        epoch = body.get("memberEpoch")
        sent_epoch = req["memberEpoch"]
        if body.get("memberId") not in (None, self.member_id):
            return self._fence(now_ms, "memberId mismatch")
        if not isinstance(epoch, int) or epoch < 1 or (sent_epoch > 0 and epoch < sent_epoch):
            return self._fence(now_ms, f"member epoch mismatch ({sent_epoch} -> {epoch})")

        self._failures = 0
        self._fences = 0
        self._last_accepted_ms = now_ms
        self.member_epoch = epoch
        status = body.get("status") or OK
        self.last_status = status
        interval = body.get("heartbeatIntervalMs")
        if isinstance(interval, int) and interval > 0:
            self.heartbeat_interval_ms = interval
        self._take_metadata(body.get("metadata"))

        assignment = body.get("assignment") or {}
        assigned = set(assignment.get("assignedShards") or [])
        coord_revoking = {_shard_name(e) for e in assignment.get("revokingShards") or []}
        actions = Actions()

        # C1: an owned shard missing from assignedShards stops; REVOKED once in-flight is 0.
        for shard in sorted(self.owned):
            if shard not in assigned:
                del self.owned[shard]
                self.revoking[shard] = REVOKING
                actions.revoke.append(shard)

        # A shard the coordinator is revoking from us that we never held (its grant was in a
        # lost answer): nothing to drain, so it is REVOKED at once instead of timing out.
        for shard in sorted(coord_revoking):
            if shard not in self.owned and shard not in self.revoking:
                self.revoking[shard] = REVOKED
                self._urgent = True

        # REVOKED entries this request carried are processed (R5): stop reporting them.
        for entry in req.get("revokingShards") or []:
            shard = entry["shard"]
            if (
                entry["state"] == REVOKED
                and self.revoking.get(shard) == REVOKED
                and shard not in coord_revoking
            ):
                del self.revoking[shard]

        # C2 / C3: new shards only from OK; SYNC_METADATA and REVOKE_PENDING are drain-only.
        if status == OK and not self.leaving:
            for shard in sorted(assigned):
                if shard in self.owned:
                    continue
                # Granted again while we were still revoking it: the coordinator resolved the
                # revocation, so the pending report is moot and the shard is ours again.
                self.revoking.pop(shard, None)
                grant = self._make_grant(shard, epoch)
                self.owned[shard] = grant
                actions.grant.append(grant)

        self.drained &= set(self.owned) | set(self.revoking)
        self._next_due_ms = now_ms + self.heartbeat_interval_ms
        return actions

    def _take_metadata(self, metadata: Any) -> None:
        if not isinstance(metadata, dict):
            return
        md_epoch = metadata.get("metadataEpoch")
        if "versions" in metadata:
            self.metadata = metadata
            if isinstance(md_epoch, int):
                self.metadata_epoch = md_epoch
            interval = metadata.get("heartbeatIntervalMs")
            if isinstance(interval, int) and interval > 0:
                self.heartbeat_interval_ms = interval
            session = metadata.get("sessionTimeoutMs")
            if isinstance(session, int) and session > 0:
                self.session_timeout_ms = session
        elif isinstance(md_epoch, int) and self.metadata is None:
            # Only an epoch and nothing held: remember it. When we do hold full metadata we
            # keep its own epoch, so that a newer epoch brings SYNC_METADATA (R7) and content.
            self.metadata_epoch = md_epoch

    def _make_grant(self, shard: str, epoch: int) -> Grant:
        md = self.metadata or {}
        prefix = md.get("keyPrefix") or DEFAULT_KEY_PREFIX
        start_position = md.get("startPosition") or "earliest"
        for version in md.get("versions") or []:
            for info in version.get("shards") or []:
                if info.get("shardId") != shard:
                    continue
                keys = ShardKeys(shard, prefix)
                first_version = not info.get("parents")
                start = "$" if first_version and start_position == "latest" else "0"
                return Grant(
                    shard=shard,
                    grant_epoch=epoch,
                    member_id=self.member_id,
                    redis_key=info.get("redisKey") or keys.stream,
                    seal_key=info.get("sealKey") or keys.sealed,
                    start_id=start,
                    key_prefix=prefix,
                )
        # Not in the metadata we hold (should not happen: R7 syncs metadata first). Derive the
        # keys and start from "0": re-reading is at-least-once, skipping would lose messages.
        log.warning("granted shard %s is not in metadata epoch %s", shard, self.metadata_epoch)
        keys = ShardKeys(shard, prefix)
        return Grant(shard, epoch, self.member_id, keys.stream, keys.sealed, "0", prefix)

    # ---- fencing, timers -----------------------------------------------------------------

    def _fence(self, now_ms: int, reason: str) -> Actions:
        """C4/C5: stop reading and acking everything, forget ownership, rejoin at epoch 0."""
        log.warning("member %s fenced (%s): rejoining with epoch 0", self.member_id, reason)
        self.last_error = reason
        stopped = sorted(set(self.owned) | set(self.revoking))
        self.owned.clear()
        self.revoking.clear()
        self.drained.clear()
        self.member_epoch = JOIN_EPOCH
        if self.leaving:
            self.left = True  # nothing left to leave: the coordinator no longer holds us
            return Actions(abort=stopped, left=True)
        # Rejoin at once, but not in a tight loop if the coordinator keeps fencing the joins.
        self._fences += 1
        if self._fences > 1:
            self._backoff(now_ms)
        else:
            self._failures = 0
        self._urgent = True
        return Actions(abort=stopped, rejoin=True)

    def fence_locally(self, now_ms: int, reason: str) -> Actions:
        """The runtime found ownership it cannot prove (fence token taken by a higher grant)."""
        return self._fence(now_ms, reason)

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
            return self._fence(now_ms, "session timeout without an accepted heartbeat")
        return Actions()

    def _backoff(self, now_ms: int) -> None:
        self._failures += 1
        delay = min(self._backoff_max, self._backoff_base * 2 ** (self._failures - 1))
        self._next_due_ms = now_ms + delay

    # ---- runtime feedback ----------------------------------------------------------------

    def revocation_finished(self, shard: str) -> None:
        """The runtime's in-flight count of a revoking shard reached 0 (C1)."""
        if self.revoking.get(shard) == REVOKING:
            self.revoking[shard] = REVOKED
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
            self.revoking[shard] = REVOKING
            actions.revoke.append(shard)
        self.owned.clear()
        return actions

    def force_leave(self) -> None:
        """Leave now even though some shards are still in flight (shutdown deadline)."""
        self.leaving = True
        for shard, state in list(self.revoking.items()):
            if state == REVOKING:
                self.revoking[shard] = REVOKED
