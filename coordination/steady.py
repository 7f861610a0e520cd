"""The steady heartbeat: the core's answer to a heartbeat that changes nothing but liveness,
decided without changing anything (issue 23.5).

`engine.heartbeat` on such a heartbeat only stamps the member's last-seen and last report and
answers with what the member is granted. `steady_answer` gives exactly that answer from a
read of the state, or None when the heartbeat may change more (the shell then applies it
under the group's lock). It never mutates `state`: the lock-free path answers on a snapshot
other requests share (`assignments.fastpath`). `tests/unit/test_steady_answer.py` checks it
against the full core on random states: every answer it gives is the core's, and the core
changes nothing else.
"""
from __future__ import annotations

from datetime import datetime

from coordination.engine import sorted_shards
from coordination.model import (
    Assignment,
    GroupState,
    HeartbeatRequest,
    HeartbeatResponse,
    MemberStatus,
)
from dataplane.protocol import ErrorCode, Status

_NOTHING: tuple[str, ...] = ()


def eligible(req: HeartbeatRequest) -> bool:
    """What the request alone must say for a steady answer (no state needed): a regular
    heartbeat (not a join R1, leave R2 or temporary leave R2s) that carries a metadataEpoch
    (R7 can be checked), reports no revocation (R5) and no drained shard (§6)."""
    return (
        req.member_epoch > 0
        and req.metadata_epoch is not None
        and not req.revoking_shards
        and not req.drained_shards
    )


def group_inputs(state: GroupState) -> tuple[object, ...]:
    """The group-wide fields `steady_answer` reads, except R1b's due time (a memoized answer is
    checked against it on every use). While they are equal, a member's steady answer changes
    only if the member is in `state.take_touched()`: the shell keeps the others' memoized
    answers across a locked pass (assignments.snapshot_cache)."""
    return (state.assignment_epoch, state.metadata_epoch, state.paused_at, state.heartbeat_interval_ms)


def steady_answer(state: GroupState, req: HeartbeatRequest, now: datetime) -> HeartbeatResponse | None:
    """`engine.heartbeat(state, req, now)`'s answer if that call would change nothing but the
    member's last-seen and last report (`steady_report`), else None. Reads `state` only."""
    if not eligible(req):
        return None
    member = state.members.get(req.member_id)
    if member is None or member.status != MemberStatus.STABLE:
        return None  # R8 refuses a missing or removed member; R6 may move a PENDING/REVOKING one
    if not (req.member_epoch == member.member_epoch == state.assignment_epoch):
        return None  # R3: another epoch is refused or answered at the member's; R6 advances it
    if req.metadata_epoch != state.metadata_epoch:
        return None  # R7: SYNC_METADATA with the whole document
    if member.revocation_deadline is not None:
        return None  # R6 would clear it: a write
    if state.rebalance_due_at is not None and now >= state.rebalance_due_at:
        return None  # R1b: the deferred recompute runs now
    granted = state.granted_to(req.member_id)
    if req.owned_shards is not None and not set(req.owned_shards) <= granted:
        return None  # R4: a claim beyond the grants is refused (or a revoking shard claimed)
    if state.revoking_from(req.member_id) or state.target_of(req.member_id) != granted:
        return None  # R6: something to revoke or to grant
    return HeartbeatResponse(
        error_code=ErrorCode.NONE,
        status=Status.PAUSED if state.paused_at is not None else Status.OK,  # §11
        member_id=req.member_id,
        member_epoch=member.member_epoch,
        assignment_epoch=state.assignment_epoch,
        heartbeat_interval_ms=state.heartbeat_interval_ms,
        assignment=Assignment(assigned=sorted_shards(granted), pending=_NOTHING, revoking=_NOTHING),
        full_metadata=False,
    )


def steady_report(req: HeartbeatRequest) -> tuple[str, ...] | None:
    """The last report the core records for an accepted heartbeat (R3 reads it when a later
    heartbeat omits ownedShards); None: the request sent none and the recorded one stands."""
    return None if req.owned_shards is None else sorted_shards(req.owned_shards)
