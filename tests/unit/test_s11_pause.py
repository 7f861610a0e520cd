"""§11 group pause on the pure core: PAUSED answers, grants and revocations unchanged."""
from __future__ import annotations

from coordination import engine
from coordination.model import Changes
from dataplane.protocol import ErrorCode, Status

from .engine_helpers import Client, at, group_with, make_group, settle


def _pause(state, now=None, actor="cli:ops"):  # type: ignore[no-untyped-def]
    state.changes = Changes()
    return engine.s11_pause(state, now or at(1), actor)


def test_s11_pause_answers_paused_with_the_same_assignment_and_moves_nothing():
    state, (a, b) = group_with(["a", "b"], 4)
    before = {sid: (s.owner, s.grant_epoch, s.target) for sid, s in state.shards.items()}
    epochs = (state.group_epoch, state.assignment_epoch, state.metadata_epoch)
    ok = a.beat(at(1))
    assert ok.status == Status.OK
    assert _pause(state)
    assert state.changes.group
    assert not state.changes.shards
    assert not state.changes.members
    assert [e.kind for e in state.changes.events] == ["paused"]
    assert state.changes.events[0].detail["actor"] == "cli:ops"
    paused = a.beat(at(2))
    assert paused.status == Status.PAUSED
    assert paused.assignment == ok.assignment
    assert (paused.member_epoch, paused.assignment_epoch) == (ok.member_epoch, ok.assignment_epoch)
    assert {sid: (s.owner, s.grant_epoch, s.target) for sid, s in state.shards.items()} == before
    assert (state.group_epoch, state.assignment_epoch, state.metadata_epoch) == epochs
    assert b.beat(at(2)).status == Status.PAUSED


def test_s11_pause_twice_and_resume_unpaused_change_nothing():
    state, _ = group_with(["a"], 2)
    assert _pause(state)
    state.changes = Changes()
    assert not engine.s11_pause(state, at(2), "x")
    assert state.changes.empty
    assert state.paused_by == "cli:ops"
    assert engine.s11_resume(state, at(3), "admin:root")
    assert [e.kind for e in state.changes.events] == ["resumed"]
    assert state.changes.events[0].detail == {"actor": "admin:root", "pausedMs": 2000}
    state.changes = Changes()
    assert not engine.s11_resume(state, at(4), "x")
    assert state.changes.empty


def test_s11_resume_answers_ok_again():
    state, (a,) = group_with(["a"], 2)
    _pause(state)
    assert a.beat(at(2)).status == Status.PAUSED
    engine.s11_resume(state, at(3), "ops")
    r = a.beat(at(4))
    assert r.status == Status.OK
    assert r.assignment is not None
    assert len(r.assignment.assigned) == 2


def test_s11_join_while_paused_is_granted_and_answered_paused():
    """Grants proceed (R6): a joiner is answered PAUSED and its shards are granted to it, owned
    but not read until the resume."""
    state, (a,) = group_with(["a"], 4)
    _pause(state)
    b = Client(state, "b")
    r = b.join(at(2))
    assert r.status == Status.PAUSED
    assert r.full_metadata
    settle([a, b], at(3))
    last = b.beat(at(4))
    assert last.status == Status.PAUSED
    assert last.assignment is not None
    assert len(last.assignment.assigned) == 2
    assert engine.group_phase(state) == "STABLE"


def test_s11_revocation_proceeds_while_paused():
    state, (a,) = group_with(["a"], 4)
    _pause(state)
    b = Client(state, "b")
    b.join(at(2))
    r = a.beat(at(2))
    assert r.status == Status.PAUSED  # not REVOKE_PENDING: the revoking list says what to drain
    assert r.assignment is not None
    assert r.assignment.revoking
    r = a.revoke_all(at(3))
    assert r.status == Status.PAUSED
    assert not r.assignment.revoking
    for s in r.assignment.assigned:  # type: ignore[union-attr]
        assert state.shards[s].owner == "a"


def test_s11_leave_and_errors_are_not_paused():
    state, (a, b) = group_with(["a", "b"], 2)
    _pause(state)
    wrong = a.send(at(2), member_epoch=a.epoch + 5)
    assert wrong.error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert wrong.status is None
    left = b.send(at(2), member_epoch=-1)
    assert left.member_epoch == -1
    assert left.status == Status.OK


def test_s11_stale_metadata_while_paused_carries_the_full_metadata():
    state, (a,) = group_with(["a"], 2)
    _pause(state)
    state.metadata_epoch += 1
    r = a.send(at(2))
    assert r.status == Status.PAUSED
    assert r.full_metadata


def test_s11_a_fresh_group_is_not_paused():
    state = make_group(2)
    assert state.paused_at is None
    assert Client(state, "a").join().status == Status.OK
