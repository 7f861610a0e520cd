"""Heartbeat rules R1–R9, the liveness rules L1/L2 (PROTOCOL.md §4–§6), static membership
R1s/R2s/L1s (§9) and the group pause (§11).

Every function takes the group's snapshot (`GroupState`, loaded under the group's lock),
mutates it through its methods, and returns the protocol answer. Errors are decided before
anything is mutated, so an error response never carries half-applied changes (R8).
Each rule lives in the function named after it.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime

from coordination.assignor import assign, reassign, reassign_by_count
from coordination.model import (
    Assignment,
    GroupPhase,
    GroupState,
    HeartbeatRequest,
    HeartbeatResponse,
    Member,
    MemberStatus,
    deadline,
)
from dataplane.protocol import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    TEMPORARY_LEAVE_EPOCH,
    ErrorCode,
    RevokeState,
    Status,
    instance_replaced,
    instance_replaced_reason,
)
from dataplane.routing import shard_sort_key


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
    return s11_paused_answer(state, _heartbeat(state, req, now))


def _heartbeat(state: GroupState, req: HeartbeatRequest, now: datetime) -> HeartbeatResponse:
    if req.member_epoch == LEAVE_EPOCH:
        return r2_leave(state, req, now)
    if req.member_epoch == TEMPORARY_LEAVE_EPOCH:
        return r2s_leave_temporarily(state, req, now)
    if req.member_epoch == JOIN_EPOCH:
        if req.instance_id is not None and state.holder_of_instance(req.instance_id) is not None:
            return r1s_replace_static_member(state, req, now)
        return r1_join(state, req, now)

    member = state.members.get(req.member_id)
    rejection = (
        r8_check_not_removed(member, req)
        or r3_check_epoch(state, member, req)  # type: ignore[arg-type]
        or r4_check_ownership(state, member, req)  # type: ignore[arg-type]
    )
    if rejection:
        return _error(rejection.code, rejection.message, req.member_id)
    assert member is not None  # noqa: S101 - narrowing: r8 refused a missing member

    # Accepted: from here on the heartbeat changes state.
    member.last_heartbeat_at = now
    if req.owned_shards is not None:
        member.last_reported_owned = sorted_shards(req.owned_shards)
    state.touch_member(member)
    r1b_rebalance_if_due(state, now)
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
        return _join_with_owned_shards(req)
    member = state.members.get(req.member_id)
    rejoin = member is not None and member.live
    # The roster's count of live members, not a walk over every member: a group at its
    # maxMembers paid one per join, what grew with the group's size (issue 26.2).
    full = r1_check_capacity(state.name, state.max_members, len(state.live_ids()), rejoin=rejoin)
    if full:
        return _error(full.code, full.message, req.member_id)
    if member is not None and member.live:
        _release_all(state, member)
    member = _new_member(state, req, now)
    bump_group_epoch(state, now=now, joiner=member)  # R1b: the recompute may wait for the window
    # A join is answered with full metadata and is not held back by R7.
    status = r6_reconcile(state, member, now, drain_only=False)
    state.emit("rejoined" if rejoin else "joined", member, clientId=req.client_id,
               **({"instanceId": req.instance_id} if req.instance_id else {}))
    return _answer(state, member, status, full_metadata=True)


def capped_rebalance_timeout_ms(requested_ms: int | None, group_ms: int) -> int:
    """Issue 27.8: a member may ask for a shorter rebalance timeout than its group's, never a
    longer one: its revoking shards would otherwise be held from newcomers for as long as it
    likes (24 h was accepted). No request (or 0): the group's."""
    return min(requested_ms, group_ms) if requested_ms else group_ms


def rebalance_timeout_of(state: GroupState, member: Member) -> int:
    """The member's rebalance timeout in force: capped at the group's current setting, so a
    member that joined before an operator lowered it (or before the cap) is bound too."""
    return capped_rebalance_timeout_ms(member.rebalance_timeout_ms, state.rebalance_timeout_ms)


def _join_with_owned_shards(req: HeartbeatRequest) -> HeartbeatResponse:
    return _error(
        ErrorCode.FENCED_MEMBER_EPOCH,
        "ownedShards must be empty when joining with memberEpoch 0 (C5)",
        req.member_id,
    )


def _new_member(state: GroupState, req: HeartbeatRequest, now: datetime) -> Member:
    member = Member(
        member_id=req.member_id,
        status=MemberStatus.PENDING,
        client_id=req.client_id,
        rebalance_timeout_ms=capped_rebalance_timeout_ms(req.rebalance_timeout_ms, state.rebalance_timeout_ms),
        joined_at=now,
        last_heartbeat_at=now,
        instance_id=req.instance_id,
        library_version=req.library_version,
    )
    state.members[req.member_id] = member
    state.touch_member(member)
    return member


# --- R1s static join: replace the member holding the instanceId (§9) ------------------------
def r1s_replace_static_member(
    state: GroupState, req: HeartbeatRequest, now: datetime
) -> HeartbeatResponse:
    """R1s: a join with an instanceId the group holds (live or temporarily left) takes that
    member's place: the old one is removed and releases everything, the group epoch rises, and
    the new member gets exactly the old target, so no other member's target changes. Its
    grants come at the new, higher epoch, past the old incarnation's fence tokens."""
    if req.owned_shards:
        return _join_with_owned_shards(req)
    assert req.instance_id is not None  # noqa: S101 - narrowing: the caller checked it
    old = state.holder_of_instance(req.instance_id)
    assert old is not None  # noqa: S101 - narrowing: the caller found the holder
    reserved = sorted_shards(state.target_of(old.member_id))
    _release_all(state, old)
    if old.member_id != req.member_id:
        old.status = MemberStatus.LEFT  # its next heartbeat: UNKNOWN_MEMBER_ID
        old.revocation_deadline = None
        old.fenced_reason = instance_replaced_reason(req.instance_id, req.member_id)
        old.fenced_by = "coordinator"
        state.touch_member(old)
        state.emit("replaced", old, instanceId=req.instance_id, by=req.member_id)
    # The joining memberId may itself be another live member rejoining under this instanceId.
    other = state.members.get(req.member_id)
    other_live = other is not None and other.live and other is not old
    if other is not None and other_live:
        _release_all(state, other)
        for shard in sorted_shards(state.target_of(other.member_id)):
            state.set_target(shard, None)  # its own target goes back to the group
    member = _new_member(state, req, now)
    if old.member_id != member.member_id:
        for shard in reserved:
            state.set_target(shard, member.member_id)
    # Only if another member's shards lost their owner does the rest of the group rebalance,
    # and even then around the new member's reserved target (the assignor keeps it as is).
    bump_group_epoch(state, recompute=other_live, reserve=(member.member_id,))
    status = r6_reconcile(state, member, now, drain_only=False)
    state.emit("rejoined" if old.member_id == req.member_id else "joined", member,
               clientId=req.client_id, instanceId=req.instance_id, replaced=old.member_id)
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
        bump_group_epoch(state, now=now)  # R1b: the recompute may wait for the batch window
        state.emit("left", member)
    return _left(state, req, -1)


def _left(state: GroupState, req: HeartbeatRequest, member_epoch: int) -> HeartbeatResponse:
    """The answer to a leave (-1) or a temporary leave (-2): nothing assigned."""
    return HeartbeatResponse(
        error_code=ErrorCode.NONE,
        status=Status.OK,
        member_id=req.member_id,
        member_epoch=member_epoch,
        assignment_epoch=state.assignment_epoch,
        heartbeat_interval_ms=state.heartbeat_interval_ms,
        assignment=Assignment(),
    )


# --- R2s temporary leave (§9) ---------------------------------------------------------------
def r2s_leave_temporarily(
    state: GroupState, req: HeartbeatRequest, now: datetime
) -> HeartbeatResponse:
    """R2s: epoch -2 from a member with an instanceId. It has stopped (C1 done for every shard),
    so what it was still revoking is released; its granted shards and its target stay reserved
    for its instanceId: no target recompute, nothing granted to anybody else, until it rejoins
    (R1s) or expires (L1s, the -2 counting as its last heartbeat). Repeating it changes nothing."""
    member = state.members.get(req.member_id)
    instance_id = member.instance_id if member is not None and member.live else req.instance_id
    if instance_id is None:
        return _error(
            ErrorCode.INVALID_REQUEST,
            "memberEpoch: -2 (temporary leave) is only for a member that joined with an instanceId"
            " (§9); use -1 to leave",
            req.member_id,
        )
    if req.instance_id is not None and req.instance_id != instance_id:
        return _error(
            ErrorCode.INVALID_REQUEST,
            f"instanceId: {req.instance_id!r} is not this member's instanceId {instance_id!r}",
            req.member_id,
        )
    if member is not None and member.live and not member.temporarily_left:
        for shard in sorted_shards(state.revoking_from(member.member_id)):
            state.release(shard)
        member.status = MemberStatus.TEMPORARILY_LEFT
        member.last_heartbeat_at = now
        member.revocation_deadline = None
        state.touch_member(member)
        state.emit("left_temporarily", member, instanceId=instance_id)
    return _left(state, req, -2)


# --- R8 (the member's side): a removed member is told why -----------------------------------
def r8_check_not_removed(member: Member | None, req: HeartbeatRequest) -> Rejection | None:
    """R8/L1: a member the group does not hold is UNKNOWN; one the coordinator fenced is FENCED.
    A temporarily left member (§9) promised to stop: it rejoins with epoch 0 (R1s). One replaced
    by a newer incarnation of its instanceId (R1s) is told so first thing in the message (the
    protocol's marker), so that it stops instead of rejoining and replacing the newer one."""
    if member is not None and not member.live and instance_replaced(member.fenced_reason):
        return Rejection(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"{member.fenced_reason}; member {req.member_id!r} must stop, not rejoin: a newer"
            " process holds its instanceId (§9)",
        )
    if member is None or member.status in (
        MemberStatus.LEFT, MemberStatus.EXPIRED, MemberStatus.TEMPORARILY_LEFT
    ):
        why = "never joined" if member is None else member.status.lower().replace("_", " ")
        if member is not None and member.fenced_reason:
            why = f"{why}: {member.fenced_reason}"
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
    shard = _shard_to_name(stale)
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
    # One "drained" event per group and version, when its last shard is drained (the event
    # log stays readable at thousands of shards; progress per shard is on the matrix).
    for version in sorted({shard_sort_key(s)[:2] for s in newly}):
        shards = [s for s in state.shards.values() if shard_sort_key(s.shard_id)[:2] == version]
        if all(s.drained for s in shards):
            state.emit("drained", None, version=version[1], shards=len(shards), lastMember=member.member_id)
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


def s6_assignable_set(state: GroupState) -> frozenset[str]:
    """`s6_assignable` as a set, kept on the snapshot until a slot's drain or parents change
    (`GroupState.mark_drained`, `load_slot`): recomputing a target must not walk every shard."""
    if state.assignable_cache is None:
        state.assignable_cache = frozenset(s6_assignable(state))
    return state.assignable_cache


def s6_refresh_assignable(state: GroupState) -> bool:
    """§6: shard slots were added (a new version) or repaired: if the assignable set no longer
    matches the target, the group epoch rises and the target is recomputed. Returns whether."""
    state.assignable_cache = None  # slots may have changed under the snapshot
    if not state.live_ids():
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
            member.revocation_deadline = deadline(now, rebalance_timeout_of(state, member))
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


# --- §11 group pause -------------------------------------------------------------------------
def s11_paused_answer(state: GroupState, response: HeartbeatResponse) -> HeartbeatResponse:
    """§11: while the group is paused every accepted heartbeat of a member that stays (joins
    and regular ones; not leaves) is answered PAUSED, with the assignment R6 gave it as for OK:
    grants and revocations go on, the member reads nothing until another status."""
    if (state.paused_at is None or response.error_code != ErrorCode.NONE
            or response.member_epoch is None or response.member_epoch <= 0):
        return response
    return replace(response, status=Status.PAUSED)


def s11_pause(state: GroupState, now: datetime, actor: str) -> bool:
    """§11: pause the group (no shard moves, no epoch changes). False: it was paused already."""
    if state.paused_at is not None:
        return False
    state.paused_at, state.paused_by = now, actor
    state.touch_group()
    state.emit("paused", actor=actor)
    return True


def s11_resume(state: GroupState, now: datetime, actor: str) -> bool:
    """§11: resume a paused group: answers are OK again and members read from where they
    stopped. False: it was not paused."""
    if state.paused_at is None:
        return False
    paused_ms = int((now - state.paused_at).total_seconds() * 1000)
    state.paused_at, state.paused_by = None, ""
    state.touch_group()
    state.emit("resumed", actor=actor, pausedMs=max(0, paused_ms))
    return True


# --- R7 metadata -----------------------------------------------------------------------------
def r7_metadata_current(state: GroupState, req: HeartbeatRequest) -> bool:
    """R7: a regular heartbeat must carry the current metadataEpoch, else SYNC_METADATA."""
    return req.metadata_epoch == state.metadata_epoch


# --- R8 (the coordinator's side), L1, L2 -----------------------------------------------------
def _shard_to_name(stale: set[str]) -> str:
    """The one stale shard a refusal names: a well-formed shard id (stream:version:index;
    stream names have no ':') before any other string the member sent, then the smallest,
    so the message names a real shard when there is one and is the same every time."""
    return min(stale, key=lambda s: (s.count(":") != 2, s))


def r8_remove_members(
    state: GroupState,
    member_ids: Iterable[str],
    *,
    status: MemberStatus,
    reason: str,
    actor: str,
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


@dataclass(frozen=True)
class Intake:
    """What the coordinator could hear: its heartbeat intake as the web tier's beacon saw it.

    The web workers stamp the beacon about once a second while they accept heartbeats; a
    stamp after a gap longer than `max_gap_ms` starts a new `up_since`. L1 and L2 count a
    member's silence only while the intake was up, so an outage of the coordinator (web
    tier, database, the path to it) never expires members that could not be heard.
    `last_beacon is None` means no beacon was ever recorded (a coordinator not run by the
    shipped server, e.g. a test client): silence then counts from the last heartbeat alone.
    """

    up_since: datetime | None = None
    last_beacon: datetime | None = None
    max_gap_ms: int = 5_000

    @property
    def recorded(self) -> bool:
        return self.last_beacon is not None

    def up_at(self, now: datetime) -> bool:
        """Unrecorded counts as up; a beacon older than the gap means the intake is down."""
        if self.last_beacon is None:
            return True
        return (now - self.last_beacon).total_seconds() * 1000 <= self.max_gap_ms

    def audible_since(self, last_heard: datetime | None) -> datetime | None:
        """Start of the silence L1/L2 may count: max(last heard, intake back since)."""
        if self.up_since is None:
            return last_heard
        return self.up_since if last_heard is None else max(last_heard, self.up_since)


UNRECORDED_INTAKE = Intake()


def _ms_since(start: datetime, now: datetime) -> float:
    return (now - start).total_seconds() * 1000


def l1_expire_silent_members(
    state: GroupState, now: datetime, intake: Intake = UNRECORDED_INTAKE
) -> list[str]:
    """L1: members silent for longer than the session timeout are expired. L1s (§9): so is a
    temporarily left member, its -2 being its last heartbeat; then its reserved shards are
    released and the target recomputed without it (one epoch bump in r8_remove_members).

    Only silence the coordinator could have heard counts: nobody expires while the intake
    is down, and after it comes back every member gets one full session to be heard.
    """
    if not intake.up_at(now):
        return []
    silent = []
    for m in state.live_members():
        since = intake.audible_since(m.last_heartbeat_at)
        if since is None or _ms_since(since, now) > state.session_timeout_ms:
            silent.append(m.member_id)
    return r8_remove_members(
        state, silent, status=MemberStatus.EXPIRED, reason="session timeout", actor="sweeper"
    )


def l1s_expires_in_s(state: GroupState, member: Member, now: datetime) -> float | None:
    """L1s: seconds until a temporarily left member expires (None for any other member)."""
    if not member.temporarily_left or member.last_heartbeat_at is None:
        return None
    silent_ms = (now - member.last_heartbeat_at).total_seconds() * 1000
    return max(0.0, (state.session_timeout_ms - silent_ms) / 1000)


def l2_fence_overdue_revocations(
    state: GroupState, now: datetime, intake: Intake = UNRECORDED_INTAKE
) -> list[str]:
    """L2: members that did not report REVOKED within their rebalance timeout are fenced.

    As for L1, a REVOKED report the coordinator could not hear does not count against the
    member: nobody is fenced while the intake is down, and after it comes back a member
    has until max(its deadline, intake back since + its rebalance timeout).
    """
    if not intake.up_at(now):
        return []
    overdue = []
    for m in state.live_members():
        if m.revocation_deadline is None or now <= m.revocation_deadline:
            continue
        if intake.up_since is None or _ms_since(intake.up_since, now) > rebalance_timeout_of(state, m):
            overdue.append(m.member_id)
    return r8_remove_members(
        state, overdue, status=MemberStatus.FENCED, reason="rebalance timeout", actor="sweeper"
    )


# --- target assignment -----------------------------------------------------------------------
def bump_group_epoch(
    state: GroupState, *, recompute: bool = True, reserve: Iterable[str] = (),
    now: datetime | None = None, joiner: Member | None = None,
) -> None:
    """Membership or assignable shards changed: new groupEpoch, target recomputed at it.
    `recompute=False` (R1s): the caller set the target itself; it becomes the one at this epoch
    (unless a deferred recompute is waiting: then that one runs now, around `reserve`).
    `reserve`: members whose target the assignor keeps as is, like temporarily left ones.
    `now` (joins and leaves, `joiner` for a join): the recompute may wait for the batch window
    (R1b)."""
    state.group_epoch += 1
    state.touch_group()
    if not recompute and state.rebalance_due_at is None:
        state.assignment_epoch = state.group_epoch
    elif now is not None and (due := r1b_defer_rebalance(state, now, joiner)) is not None:
        state.rebalance_due_at = due
        state.rebalance_deferred_at = state.rebalance_deferred_at or latest(state.rebalanced_at, now)
        r1b_rebalance_if_due(state, now)
    else:
        recompute_target(state, reserve=reserve)
        if now is not None:
            state.rebalanced_at = latest(state.rebalanced_at, now)


# --- R1b join batching ------------------------------------------------------------------------
# A burst of joins keeps pushing the recompute back by a window, but never past this many
# windows after the first one deferred it (Kafka's initial rebalance delay works alike).
R1B_MAX_WINDOWS = 5


def r1b_defer_rebalance(
    state: GroupState, now: datetime, joiner: Member | None = None
) -> datetime | None:
    """R1b (join batching, like Kafka's initial rebalance delay): when a join or leave changes
    the membership, the target recompute waits until the returned time, so that joins and
    leaves arriving together are assigned once (None: recompute now). It waits when one is
    already waiting, when the group's last recompute was less than `rebalance_window_ms` ago,
    or when the joiner is the group's only member (a fleet starting together does not hand
    every shard to the first one). Each change moves the due time to a window after it, but
    not past `R1B_MAX_WINDOWS` windows after the first deferred change. Meanwhile the group is
    ASSIGNING and a joiner is answered with an empty assignment at the current assignment
    epoch; it gets its shards on a later heartbeat (§3, R6).
    Changes may apply out of their `now` order (requests of several processes queue for the
    group's lock): a change whose `now` is before the last recompute is within its window,
    and a due time never moves earlier."""
    window = state.rebalance_window_ms
    if window <= 0:
        return None
    now = latest(state.rebalanced_at, now)
    if state.rebalance_due_at is None:
        last = state.rebalanced_at
        recent = last is not None and now < deadline(last, window)
        # From the roster: not a walk over every member per join.
        alone = joiner is not None and state.live_ids() <= {joiner.member_id}
        if not (recent or alone):
            return None
    since = state.rebalance_deferred_at or now
    due = max(deadline(now, window), state.rebalance_due_at or now)
    return min(due, deadline(since, window * R1B_MAX_WINDOWS))


def r1b_rebalance_if_due(state: GroupState, now: datetime) -> bool:
    """R1b: the deferred recompute runs at the first locked heartbeat, join, leave or sweep at
    or after its due time. Returns whether it ran."""
    due = state.rebalance_due_at
    if due is None or now < due:
        return False
    recompute_target(state)
    state.rebalanced_at = latest(state.rebalanced_at, now)
    state.touch_group()
    return True


def latest(previous: datetime | None, now: datetime) -> datetime:
    """The later of two instants: requests that queued for the lock apply out of arrival order,
    and the window runs from the last recompute however late its request arrived (R1b)."""
    return now if previous is None or now > previous else previous


def recompute_target(state: GroupState, reserve: Iterable[str] = ()) -> None:
    """The assignor's target for the live members at this group epoch. A settled target (every
    targeted shard assignable) changes by `reassign_by_count`, from the roster the snapshot
    keeps (members by target count), which costs the members and shards that move (issue
    26.2); with members reserved beyond the temporarily left ones (R1s) by `reassign`, which
    walks the members; any other target goes through `assign` over every shard. All three
    give the same result."""
    live = state.live_ids()
    # (§9) the temporarily left members' targets are reserved for their instanceId.
    reserved = state.reserved_ids() | (set(reserve) & live)
    assignable = s6_assignable_set(state)
    untargeted = state.untargeted()
    free = [s for s in untargeted if s in assignable]
    if len(state.shards) - len(untargeted) != len(assignable) - len(free):
        # some target is not assignable (drained, or a new version's slots): full pass
        previous = {s.shard_id: s.target for s in state.shards.values() if s.target is not None}
        target = assign(list(live), list(assignable), previous, reserved=reserved)
        for shard_id, slot in state.shards.items():
            new = target.get(shard_id)
            if slot.target != new:
                state.set_target(shard_id, new)
    else:
        orphaned = state.orphaned_targets()
        targets = state.targets()
        if reserved == state.reserved_ids():
            total = len(assignable) - sum(len(targets.get(r, ())) for r in reserved)
            moves = reassign_by_count(state.roster_buckets(), targets, total, assignable,
                                      free + orphaned)
        else:
            # `targets` serves as `held`: reassign reads it for live members only.
            moves = reassign(live, assignable, targets, free + orphaned, reserved=reserved)
        for shard_id, member_id in moves.items():
            state.set_target(shard_id, member_id)
        for shard_id in orphaned:
            if shard_id not in moves:  # nobody may take it (every member reserved)
                state.set_target(shard_id, None)
    state.assignment_epoch = state.group_epoch
    state.rebalance_due_at = state.rebalance_deferred_at = None
    state.emit("rebalanced", assignmentEpoch=state.assignment_epoch, members=len(live))


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
    # A temporarily left member (§9) waits for its rejoin, not for reconciliation.
    active = [m for m in live if not m.temporarily_left]
    if any(m.status != MemberStatus.STABLE or m.member_epoch != state.assignment_epoch for m in active):
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
