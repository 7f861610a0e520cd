"""Heartbeat rules R1–R9 and the liveness rules L1/L2 (PROTOCOL.md §4–§6).

Every function takes the group's snapshot (`GroupState`, loaded under the group's lock),
mutates it through its methods, and returns the protocol answer. Errors are decided before
anything is mutated, so an error response never carries half-applied changes (R8).
Each rule lives in the function named after it.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from coordination.assignor import assign
from coordination.model import (
    Assignment,
    ErrorCode,
    GroupPhase,
    GroupState,
    HeartbeatRequest,
    HeartbeatResponse,
    Member,
    MemberStatus,
    RevokeState,
    Status,
    deadline,
    shard_sort_key,
)


@dataclass(frozen=True)
class Rejection:
    code: ErrorCode
    message: str


def sorted_shards(shards: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(shards, key=shard_sort_key))


def _error(code: ErrorCode, message: str, member_id: str | None) -> HeartbeatResponse:
    return HeartbeatResponse(error_code=code, error_message=message, member_id=member_id)


# --- entry point ---------------------------------------------------------------------------
def heartbeat(state: GroupState, req: HeartbeatRequest, now: datetime) -> HeartbeatResponse:
    """Apply one heartbeat to the group (the caller holds the group's lock)."""
    if req.member_epoch == -1:
        return r2_leave(state, req, now)
    if req.member_epoch == 0:
        return r1_join(state, req, now)

    member = state.members.get(req.member_id)
    rejection = (
        r8_check_not_removed(member, req)
        or r3_check_epoch(state, member, req)  # type: ignore[arg-type]
        or r4_check_ownership(state, member, req)  # type: ignore[arg-type]
    )
    if rejection:
        return _error(rejection.code, rejection.message, req.member_id)
    assert member is not None

    # Accepted: from here on the heartbeat changes state.
    member.last_heartbeat_at = now
    if req.owned_shards is not None:
        member.last_reported_owned = sorted_shards(req.owned_shards)
    state.touch_member(member)
    r5_apply_revocations(state, member, req)
    s6_record_drained(state, member, req.drained_shards)
    drain_only = not r7_metadata_current(state, req)
    status = r6_reconcile(state, member, now, drain_only=drain_only)
    return _answer(state, member, status, full_metadata=drain_only)


def _answer(
    state: GroupState, member: Member, status: Status, *, full_metadata: bool
) -> HeartbeatResponse:
    granted = state.granted_to(member.member_id)
    return HeartbeatResponse(
        error_code=ErrorCode.NONE,
        status=status,
        member_id=member.member_id,
        member_epoch=member.member_epoch,
        assignment_epoch=state.assignment_epoch,
        heartbeat_interval_ms=state.heartbeat_interval_ms,
        assignment=Assignment(
            assigned=sorted_shards(granted),
            pending=sorted_shards(state.target_of(member.member_id) - granted),
            revoking=sorted_shards(state.revoking_from(member.member_id)),
        ),
        full_metadata=full_metadata,
    )


# --- R1 join ---------------------------------------------------------------------------------
def r1_join(state: GroupState, req: HeartbeatRequest, now: datetime) -> HeartbeatResponse:
    """R1: epoch 0 joins or rejoins; a rejoin first releases what the member held (C4)."""
    if req.owned_shards:
        return _error(
            ErrorCode.FENCED_MEMBER_EPOCH,
            "ownedShards must be empty when joining with memberEpoch 0 (C5)",
            req.member_id,
        )
    member = state.members.get(req.member_id)
    rejoin = member is not None and member.live
    full = r1_check_capacity(state.name, state.max_members, len(state.live_members()), rejoin=rejoin)
    if full:
        return _error(full.code, full.message, req.member_id)
    if member is not None and member.live:
        _release_all(state, member)
    member = Member(
        member_id=req.member_id,
        status=MemberStatus.PENDING,
        client_id=req.client_id,
        rebalance_timeout_ms=req.rebalance_timeout_ms or state.rebalance_timeout_ms,
        joined_at=now,
        last_heartbeat_at=now,
    )
    state.members[req.member_id] = member
    state.touch_member(member)
    bump_group_epoch(state)
    # A join is answered with full metadata and is not held back by R7.
    status = r6_reconcile(state, member, now, drain_only=False)
    state.emit("rejoined" if rejoin else "joined", member, clientId=req.client_id)
    return _answer(state, member, status, full_metadata=True)


def r1_check_capacity(group: str, max_members: int, live: int, *, rejoin: bool) -> Rejection | None:
    """R1: a new member is refused when the group already has maxMembers live members.
    Needs only counts, so the shell can decide it before loading the group (issue 8)."""
    if rejoin or live < max_members:
        return None
    return Rejection(
        ErrorCode.GROUP_MAX_SIZE_REACHED,
        f"group {group!r} already has its maximum of {max_members} members",
    )


# --- R2 leave --------------------------------------------------------------------------------
def r2_leave(state: GroupState, req: HeartbeatRequest, now: datetime) -> HeartbeatResponse:
    """R2: epoch -1 leaves; leaving twice (or as a stranger) is not an error."""
    member = state.members.get(req.member_id)
    if member is not None and member.live:
        _release_all(state, member)
        member.status = MemberStatus.LEFT
        member.last_heartbeat_at = now
        member.revocation_deadline = None
        state.touch_member(member)
        bump_group_epoch(state)
        state.emit("left", member)
    return HeartbeatResponse(
        error_code=ErrorCode.NONE,
        status=Status.OK,
        member_id=req.member_id,
        member_epoch=-1,
        assignment_epoch=state.assignment_epoch,
        heartbeat_interval_ms=state.heartbeat_interval_ms,
        assignment=Assignment(),
    )


# --- R8 (the member's side): a removed member is told why -----------------------------------
def r8_check_not_removed(member: Member | None, req: HeartbeatRequest) -> Rejection | None:
    """R8/L1: a member the group does not hold is UNKNOWN; one the coordinator fenced is FENCED."""
    if member is None or member.status in (MemberStatus.LEFT, MemberStatus.EXPIRED):
        why = "never joined" if member is None else member.status.lower()
        return Rejection(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"member {req.member_id!r} is not in the group ({why}); rejoin with memberEpoch 0",
        )
    if member.status == MemberStatus.FENCED:
        return Rejection(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"member {req.member_id!r} was fenced ({member.fenced_reason or 'no reason given'});"
            " rejoin with memberEpoch 0",
        )
    return None


# --- R3 epoch check --------------------------------------------------------------------------
def r3_check_epoch(state: GroupState, member: Member, req: HeartbeatRequest) -> Rejection | None:
    """R3: the epoch must be current, or the previous one when the last response was lost."""
    if req.member_epoch == member.member_epoch:
        return None
    if req.member_epoch == member.previous_member_epoch:
        owned = req.owned_shards if req.owned_shards is not None else (member.last_reported_owned or ())
        if set(owned) <= state.held_by(member.member_id):
            return None
    return Rejection(
        ErrorCode.FENCED_MEMBER_EPOCH,
        f"memberEpoch {req.member_epoch} does not match the member's epoch {member.member_epoch}",
    )


# --- R4 ownership check (C6) -----------------------------------------------------------------
def r4_check_ownership(
    state: GroupState, member: Member, req: HeartbeatRequest
) -> Rejection | None:
    """R4/C6: every shard reported as owned (or still REVOKING) must be held by this member."""
    held = state.held_by(member.member_id)
    claimed = set(req.owned_shards or ())
    claimed |= {r.shard for r in req.revoking_shards if r.state == RevokeState.REVOKING}
    stale = claimed - held
    if not stale:
        return None
    shard = min(stale, key=lambda s: (s.count(":") != 2, s))
    slot = state.shards.get(shard)
    if slot is None:
        why = "is not an assignable shard of this group"
    elif slot.owner is not None:
        why = "is owned by another member"
    elif slot.target == member.member_id:
        why = "is still pending for this member"
    else:
        why = "is not assigned to this member"
    return Rejection(ErrorCode.FENCED_MEMBER_EPOCH, f"stale ownership: shard {shard!r} {why}")


# --- R5 revocation ---------------------------------------------------------------------------
def r5_apply_revocations(state: GroupState, member: Member, req: HeartbeatRequest) -> None:
    """R5: REVOKED releases a shard revoking from this member; duplicates are ignored."""
    revoking = state.revoking_from(member.member_id)
    for report in req.revoking_shards:
        if report.state == RevokeState.REVOKED and report.shard in revoking:
            state.release(report.shard)


# --- §6 step 3: drained reports --------------------------------------------------------------
def s6_record_drained(state: GroupState, member: Member, drained: Iterable[str]) -> None:
    """§6: a sealed shard this member holds and read to the end leaves the assignable set."""
    held = state.held_by(member.member_id)
    newly = [
        s for s in drained
        if s in held and state.shards[s].sealed and not state.shards[s].drained
    ]
    for shard in newly:
        state.mark_drained(shard)
        state.emit("drained", member, shard=shard)
    if newly:
        bump_group_epoch(state)


def s6_assignable(state: GroupState) -> list[str]:
    """§6: undrained shards whose parents (still live in this group) are all drained."""
    shards = state.shards
    return [
        s.shard_id
        for s in shards.values()
        if not s.drained and all(p not in shards or shards[p].drained for p in s.parents)
    ]


def s6_refresh_assignable(state: GroupState) -> bool:
    """§6: shard slots were added (a new version) or repaired: if the assignable set no longer
    matches the target, the group epoch rises and the target is recomputed. Returns whether."""
    if not state.live_members():
        return False  # no target to fix; the next join computes one
    assignable = set(s6_assignable(state))
    targeted = {sid for sid, slot in state.shards.items() if slot.target is not None}
    if assignable == targeted:
        return False
    bump_group_epoch(state)
    return True


# --- R6 reconcile ----------------------------------------------------------------------------
def r6_reconcile(state: GroupState, member: Member, now: datetime, *, drain_only: bool) -> Status:
    """R6: revoke what left the target; with nothing to revoke, advance and grant free shards."""
    mid = member.member_id
    target = state.target_of(mid)
    for shard in sorted_shards(state.granted_to(mid) - target):
        state.start_revoke(shard)
    state.touch_member(member)
    if state.revoking_from(mid):
        member.status = MemberStatus.REVOKING
        if member.revocation_deadline is None:
            member.revocation_deadline = deadline(now, member.rebalance_timeout_ms)
        return Status.SYNC_METADATA if drain_only else Status.REVOKE_PENDING

    member.revocation_deadline = None
    if drain_only:  # R7/C3: no new grants until the member holds current metadata
        member.status = MemberStatus.PENDING
        return Status.SYNC_METADATA
    if member.member_epoch != state.assignment_epoch:
        member.previous_member_epoch = member.member_epoch
        member.member_epoch = state.assignment_epoch
    granted = state.granted_to(mid)
    for shard in sorted_shards(target - granted):
        slot = state.shards[shard]
        # Free: nobody owns or revokes it. Grant epochs only rise (the fencing token).
        if slot.owner is None and member.member_epoch > slot.grant_epoch:
            state.grant(shard, mid, member.member_epoch)
    pending = target - state.granted_to(mid)
    member.status = MemberStatus.PENDING if pending else MemberStatus.STABLE
    return Status.OK


# --- R7 metadata -----------------------------------------------------------------------------
def r7_metadata_current(state: GroupState, req: HeartbeatRequest) -> bool:
    """R7: a regular heartbeat must carry the current metadataEpoch, else SYNC_METADATA."""
    return req.metadata_epoch == state.metadata_epoch


# --- R8 (the coordinator's side), L1, L2 -----------------------------------------------------
def r8_remove_members(
    state: GroupState,
    member_ids: Iterable[str],
    *,
    status: MemberStatus,
    reason: str,
    actor: str,
    now: datetime,
) -> list[str]:
    """R8: the coordinator removes members itself: shards released, one epoch bump."""
    removed = []
    for mid in member_ids:
        member = state.members.get(mid)
        if member is None or not member.live:
            continue
        _release_all(state, member)
        member.status = status
        member.revocation_deadline = None
        member.fenced_reason = reason
        member.fenced_by = actor
        state.touch_member(member)
        state.emit(status.lower(), member, reason=reason, actor=actor)
        removed.append(mid)
    if removed:
        bump_group_epoch(state)
    return removed


def l1_expire_silent_members(state: GroupState, now: datetime) -> list[str]:
    """L1: members silent for longer than the session timeout are expired."""
    silent = [
        m.member_id
        for m in state.live_members()
        if m.last_heartbeat_at is None
        or (now - m.last_heartbeat_at).total_seconds() * 1000 > state.session_timeout_ms
    ]
    return r8_remove_members(
        state, silent, status=MemberStatus.EXPIRED, reason="session timeout", actor="sweeper",
        now=now,
    )


def l2_fence_overdue_revocations(state: GroupState, now: datetime) -> list[str]:
    """L2: members that did not report REVOKED within their rebalance timeout are fenced."""
    overdue = [
        m.member_id
        for m in state.live_members()
        if m.revocation_deadline is not None and now > m.revocation_deadline
    ]
    return r8_remove_members(
        state, overdue, status=MemberStatus.FENCED, reason="rebalance timeout", actor="sweeper",
        now=now,
    )


# --- target assignment -----------------------------------------------------------------------
def bump_group_epoch(state: GroupState) -> None:
    """Membership or assignable shards changed: new groupEpoch, target recomputed at it."""
    state.group_epoch += 1
    state.touch_group()
    recompute_target(state)


def needs_full_state(req: HeartbeatRequest) -> bool:
    """Joins, leaves and drain reports can change the target; other heartbeats cannot."""
    return req.member_epoch <= 0 or bool(req.drained_shards)


def recompute_target(state: GroupState) -> None:
    if state.partial:
        raise RuntimeError("cannot recompute the target from a partial snapshot")
    members = [m.member_id for m in state.live_members()]
    previous = {s.shard_id: s.target for s in state.shards.values() if s.target is not None}
    target = assign(members, s6_assignable(state), previous)
    for shard_id, slot in state.shards.items():
        new = target.get(shard_id)
        if slot.target != new:
            state.set_target(shard_id, new)
    state.assignment_epoch = state.group_epoch
    state.emit("rebalanced", assignmentEpoch=state.assignment_epoch, members=len(members))


def _release_all(state: GroupState, member: Member) -> None:
    for shard in sorted_shards(state.held_by(member.member_id)):
        state.release(shard)


# --- read-side summaries ---------------------------------------------------------------------
def group_phase(state: GroupState) -> GroupPhase:
    live = state.live_members()
    if not live:
        return GroupPhase.EMPTY
    if state.assignment_epoch < state.group_epoch:
        return GroupPhase.ASSIGNING
    if any(m.status != MemberStatus.STABLE or m.member_epoch != state.assignment_epoch for m in live):
        return GroupPhase.RECONCILING
    return GroupPhase.STABLE


def owners_are_exclusive(state: GroupState) -> bool:
    """R9 as seen in one snapshot: each shard has at most one holder (by construction)."""
    seen: set[str] = set()
    for mid in state.members:
        held = state.held_by(mid)
        if seen & held:
            return False
        seen |= held
    return True
