"""`coordination.steady.steady_answer` against the full core (issue 23.5).

On random group states and requests: whenever the pure decision gives an answer, the core
(`engine.heartbeat`, on a copy) gives the same answer and changes nothing but the member's
last-seen and last report; the decision itself changes nothing; and when the core's
heartbeat is liveness-only at the member's own epoch, the decision does answer (it is not
so cautious that the steady path would never be taken).
"""
from __future__ import annotations

import dataclasses
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from coordination import engine
from coordination.model import GroupState, HeartbeatRequest, Member, MemberStatus, RevokeReport, ShardSlot
from coordination.steady import eligible, group_inputs, steady_answer, steady_report
from dataplane.protocol import ErrorCode, RevokeState

from .engine_helpers import T0, Client, make_group, settle

MEMBERS = ("a", "b", "c")
SHARDS = tuple(f"orders:1:{i}" for i in range(5))


def snapshot_of(state: GroupState) -> tuple:
    """Everything a heartbeat could change, in a comparable form."""
    members = {mid: (m.status, m.member_epoch, m.previous_member_epoch, m.client_id, m.rebalance_timeout_ms,
                     m.revocation_deadline, m.last_heartbeat_at, m.last_reported_owned, m.fenced_reason)
               for mid, m in state.members.items()}
    slots = {sid: (s.owner, s.revoking, s.grant_epoch, s.target, s.drained, s.sealed)
             for sid, s in state.shards.items()}
    return (state.group_epoch, state.assignment_epoch, state.metadata_epoch, state.rebalanced_at,
            state.rebalance_due_at, state.rebalance_deferred_at, state.paused_at, members, slots)


def clone(state: GroupState) -> GroupState:
    """An independent copy for the core to change (members and slots copied one by one: the
    member table keeps the roster)."""
    return GroupState(
        name=state.name, stream=state.stream, group_epoch=state.group_epoch,
        assignment_epoch=state.assignment_epoch, metadata_epoch=state.metadata_epoch,
        max_members=state.max_members, heartbeat_interval_ms=state.heartbeat_interval_ms,
        session_timeout_ms=state.session_timeout_ms, rebalance_timeout_ms=state.rebalance_timeout_ms,
        rebalance_window_ms=state.rebalance_window_ms, rebalanced_at=state.rebalanced_at,
        rebalance_due_at=state.rebalance_due_at, rebalance_deferred_at=state.rebalance_deferred_at,
        paused_at=state.paused_at, paused_by=state.paused_by,
        members={mid: dataclasses.replace(m) for mid, m in state.members.items()},
        shards={sid: dataclasses.replace(s) for sid, s in state.shards.items()},
    )


def without_liveness(snap: tuple, member_id: str) -> tuple:
    members = dict(snap[7])
    if member_id in members:
        row = members[member_id]
        members[member_id] = (*row[:6], None, None, row[8])
    return (*snap[:7], members, snap[8])


@st.composite
def states(draw: st.DrawFn) -> GroupState:
    epoch = draw(st.integers(1, 4))
    members = {}
    for mid in draw(st.lists(st.sampled_from(MEMBERS), unique=True)):
        members[mid] = Member(
            member_id=mid,
            status=draw(st.sampled_from(list(MemberStatus))),
            member_epoch=draw(st.integers(1, 4)),
            previous_member_epoch=draw(st.integers(0, 3)),
            revocation_deadline=draw(st.sampled_from([None, None, T0 + timedelta(seconds=30)])),
            last_reported_owned=draw(st.sampled_from([(), SHARDS[:1], None])),
        )
    names = [None, *members]
    shards = {}
    for sid in SHARDS:
        owner = draw(st.sampled_from(names))
        shards[sid] = ShardSlot(
            shard_id=sid, owner=owner, revoking=owner is not None and draw(st.booleans()),
            grant_epoch=draw(st.integers(0, epoch)), target=draw(st.sampled_from(names)),
        )
    due = draw(st.sampled_from([None, T0 - timedelta(seconds=1), T0 + timedelta(seconds=1)]))
    return GroupState(
        name="g", stream="orders", group_epoch=epoch, assignment_epoch=epoch,
        metadata_epoch=draw(st.integers(1, 2)), members=members, shards=shards,
        rebalance_window_ms=1000, rebalance_due_at=due, rebalance_deferred_at=due,
        paused_at=draw(st.sampled_from([None, T0 - timedelta(seconds=5)])),
    )


@st.composite
def requests(draw: st.DrawFn) -> HeartbeatRequest:
    return HeartbeatRequest(
        member_id=draw(st.sampled_from(MEMBERS)),
        member_epoch=draw(st.integers(-2, 4)),
        metadata_epoch=draw(st.sampled_from([None, 1, 2])),
        owned_shards=draw(st.one_of(st.none(), st.lists(st.sampled_from(SHARDS), unique=True).map(tuple))),
        revoking_shards=draw(st.sampled_from([(), (RevokeReport(SHARDS[0], RevokeState.REVOKED),)])),
        drained_shards=draw(st.sampled_from([(), (SHARDS[1],)])),
    )


def check(state: GroupState, req: HeartbeatRequest) -> bool:
    """The three claims for one (state, request); returns whether a steady answer was given."""
    before = snapshot_of(state)
    answer = steady_answer(state, req, T0)
    assert snapshot_of(state) == before  # pure: nothing changed
    assert state.changes.empty

    core_state = clone(state)
    core = engine.heartbeat(core_state, req, T0)
    changes = core_state.changes
    liveness_only = (
        core.error_code == ErrorCode.NONE and not core.full_metadata and not changes.group
        and not changes.shards and not changes.events and changes.members <= {req.member_id}
        and without_liveness(snapshot_of(core_state), req.member_id) == without_liveness(before, req.member_id)
    )
    if answer is not None:
        assert answer == core
        assert liveness_only
        member = core_state.members[req.member_id]
        assert member.last_heartbeat_at == T0
        report = steady_report(req)
        assert member.last_reported_owned == (report if report is not None
                                              else state.members[req.member_id].last_reported_owned)
    elif (liveness_only and eligible(req) and core.member_epoch == req.member_epoch
          and not core.assignment.pending and not core.assignment.revoking):
        # A steady answer is a settled member's: one with shards still pending or revoking
        # (a PENDING member whose target waits, say) is the locked path's, even when the
        # core then changes nothing.
        raise AssertionError(f"the core changed nothing but liveness, yet no steady answer: {req}")
    return answer is not None


def tidy(state: GroupState, mid: str, data: st.DataObject) -> None:
    """Bring `mid` close to steady (STABLE at the assignment epoch, its target its grants),
    with each part left out at random: random states alone are almost never steady."""
    if mid not in state.members:
        state.members[mid] = Member(member_id=mid, status=MemberStatus.STABLE)
    member = state.members[mid]
    if data.draw(st.integers(0, 5)):
        member.status = MemberStatus.STABLE
    if data.draw(st.integers(0, 5)):
        member.member_epoch = state.assignment_epoch
    if data.draw(st.integers(0, 5)):
        member.revocation_deadline = None
    if data.draw(st.integers(0, 5)):
        for slot in list(state.shards.values()):
            if slot.owner == mid or slot.target == mid:
                state.load_slot(ShardSlot(slot.shard_id, owner=mid, revoking=False,
                                          grant_epoch=slot.grant_epoch, target=mid))
    if not data.draw(st.integers(0, 3)):  # one slot moved: a grant or a revocation due
        slot = state.shards[data.draw(st.sampled_from(SHARDS))]
        state.load_slot(ShardSlot(slot.shard_id, owner=data.draw(st.sampled_from([None, mid, "b"])),
                                  revoking=slot.revoking, grant_epoch=slot.grant_epoch,
                                  target=data.draw(st.sampled_from([None, mid, "c"]))))


@settings(max_examples=600, deadline=None)
@given(states(), requests(), st.data())
def test_i23_5_steady_answer_is_the_cores_answer_on_random_states(
    state: GroupState, req: HeartbeatRequest, data: st.DataObject
):
    if data.draw(st.booleans()):
        tidy(state, req.member_id, data)
        if data.draw(st.integers(0, 3)):
            req = dataclasses.replace(req, member_epoch=state.members[req.member_id].member_epoch)
        if data.draw(st.integers(0, 3)):
            req = dataclasses.replace(req, metadata_epoch=state.metadata_epoch, revoking_shards=(),
                                      drained_shards=())
    check(state, req)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3), st.integers(2, 8), st.data())
def test_i23_5_steady_answer_agrees_with_the_core_after_real_histories(members: int, shards: int, data: st.DataObject):
    """States the engine itself produced (joins, settling), then every member's next heartbeat
    in several shapes: a settled member's steady heartbeat must be answered."""
    state = make_group(shards)
    clients = [Client(state, m) for m in MEMBERS[:members]]
    for c in clients:
        c.join()
    settle(clients)
    if data.draw(st.booleans()):
        engine.s11_pause(state, T0, "test")
    answered = 0
    for c in clients:
        owned = data.draw(st.sampled_from([tuple(c.owned), None, tuple(c.owned[:1])]))
        req = HeartbeatRequest(member_id=c.member_id, member_epoch=c.epoch, metadata_epoch=c.metadata_epoch,
                               owned_shards=owned)
        state.changes = type(state.changes)()
        answered += check(state, req)
    assert answered == members  # settled: every member's heartbeat is steady


def test_i23_5_steady_answer_refuses_what_the_core_would_change():
    state = make_group(4)
    a = Client(state, "a")
    a.join()
    settle([a])
    base = HeartbeatRequest(member_id="a", member_epoch=a.epoch, metadata_epoch=a.metadata_epoch,
                            owned_shards=tuple(a.owned))
    assert steady_answer(state, base, T0) is not None
    for req in (
        HeartbeatRequest(member_id="a", member_epoch=a.epoch, metadata_epoch=(a.metadata_epoch or 0) + 1),
        HeartbeatRequest(member_id="a", member_epoch=a.epoch + 1, metadata_epoch=a.metadata_epoch),
        HeartbeatRequest(member_id="a", member_epoch=a.epoch, metadata_epoch=a.metadata_epoch,
                         owned_shards=("orders:1:9",)),
        HeartbeatRequest(member_id="zz", member_epoch=a.epoch, metadata_epoch=a.metadata_epoch),
        HeartbeatRequest(member_id="a", member_epoch=a.epoch, metadata_epoch=a.metadata_epoch,
                         drained_shards=("orders:1:0",)),
    ):
        assert steady_answer(state, req, T0) is None, req
    state.rebalance_due_at = T0
    assert steady_answer(state, base, T0) is None  # R1b: due now


def _steady_requests(state: GroupState, mid: str) -> list[HeartbeatRequest]:
    """The steady heartbeats `mid` could send on `state`: its whole grant, a part, or none."""
    member = state.members.get(mid)
    epoch = member.member_epoch if member is not None else 1
    granted = tuple(sorted(state.granted_to(mid)))
    return [HeartbeatRequest(member_id=mid, member_epoch=epoch, metadata_epoch=state.metadata_epoch,
                             owned_shards=owned) for owned in (granted, granted[:1], None)]


@settings(max_examples=400, deadline=None)
@given(states(), st.lists(requests(), min_size=1, max_size=3), st.data())
def test_i26_2_a_locked_pass_changes_no_steady_answer_but_the_touched_members(
    state: GroupState, passes: list[HeartbeatRequest], data: st.DataObject
):
    """What lets the shell keep memoized steady answers across a locked pass
    (assignments.snapshot_cache.load_for_heartbeat): while `group_inputs` stay equal, the core's
    heartbeats, sweeps and pauses change the steady answer of no member that
    `GroupState.take_touched` leaves out. (R1b's due time is checked on every memo hit.)"""
    for mid in MEMBERS:
        if data.draw(st.booleans()):
            tidy(state, mid, data)
    before = {(mid, req): steady_answer(state, req, T0) for mid in MEMBERS for req in _steady_requests(state, mid)}
    inputs = group_inputs(state)
    state.take_touched()
    now = T0 + timedelta(seconds=data.draw(st.sampled_from([0, 1, 40, 100])))
    for req in passes:  # one locked pass: the heartbeats of a group-commit batch, then a sweep
        state.changes = type(state.changes)()
        engine.heartbeat(state, req, now)
    sweep = data.draw(st.sampled_from(["none", "expire", "fence", "pause", "resume", "due"]))
    if sweep == "expire":
        engine.l1_expire_silent_members(state, now)
    elif sweep == "fence":
        engine.l2_fence_overdue_revocations(state, now)
    elif sweep == "pause":
        engine.s11_pause(state, now, "test")
    elif sweep == "resume":
        engine.s11_resume(state, now, "test")
    elif sweep == "due":
        engine.r1b_rebalance_if_due(state, now)
    touched = state.take_touched()
    if group_inputs(state) != inputs:
        return  # the shell drops every memoized answer
    due = state.rebalance_due_at is not None and state.rebalance_due_at <= T0
    for (mid, req), answer in before.items():
        if answer is None or mid in touched:
            continue  # nothing memoized, or dropped
        assert steady_answer(state, req, T0) == (None if due else answer), (mid, req, sweep)


def test_i26_2_take_touched_names_the_members_a_recompute_moves_and_only_them():
    """A join that recomputes the target touches every member whose target changes; a steady
    heartbeat (the core's liveness-only answer) touches only its member."""
    state = make_group(8)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    settle([a])
    b.join()
    settle([a, b])
    state.take_touched()
    a.send()  # steady: last-seen only
    assert state.take_touched() <= {"a"}
    c = Client(state, "c")
    c.join()
    assert {"a", "b", "c"} <= state.take_touched()  # each gives shards to c
