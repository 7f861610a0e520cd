"""Issue 27.8: a client-chosen rebalanceTimeoutMs is capped at the group's setting."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coordination import engine
from coordination.model import MemberStatus

from .engine_helpers import Client, at, make_group

DAY_MS = 86_400_000


def _revoking_member(requested_ms: int | None, group_ms: int = 60_000) -> Client:
    state = make_group(4, rebalance_timeout_ms=group_ms)
    a, b = Client(state, "a"), Client(state, "b")
    a._apply(a.send(at(0), rebalance_timeout_ms=requested_ms))  # the join
    a.beat(at(0.5))
    b.join(at(0.5))
    a.send(at(1))  # told to revoke: the deadline starts now
    assert state.members["a"].status == MemberStatus.REVOKING
    return a


def test_i27_8_a_day_long_rebalance_timeout_is_capped_at_the_groups():
    a = _revoking_member(DAY_MS, group_ms=60_000)
    assert a.state.members["a"].rebalance_timeout_ms == 60_000
    assert a.state.members["a"].revocation_deadline == at(61)
    assert engine.l2_fence_overdue_revocations(a.state, at(61.5)) == ["a"]


def test_i27_8_a_shorter_rebalance_timeout_than_the_groups_is_kept():
    a = _revoking_member(5_000, group_ms=60_000)
    assert a.state.members["a"].revocation_deadline == at(6)
    assert engine.l2_fence_overdue_revocations(a.state, at(6.5)) == ["a"]


def test_i27_8_no_rebalance_timeout_asked_is_the_groups():
    a = _revoking_member(None, group_ms=20_000)
    assert a.state.members["a"].revocation_deadline == at(21)


def test_i27_8_a_member_that_joined_before_the_group_lowered_its_timeout_is_bound_by_the_new_one():
    state = make_group(4, rebalance_timeout_ms=60_000)
    a, b = Client(state, "a"), Client(state, "b")
    a.join(at(0))
    a.beat(at(0.5))
    assert state.members["a"].rebalance_timeout_ms == 60_000
    state.rebalance_timeout_ms = 10_000  # the operator lowers it; the member row keeps 60 s
    b.join(at(1))
    a.send(at(1))
    assert state.members["a"].revocation_deadline == at(11)


@given(requested=st.one_of(st.none(), st.integers(100, DAY_MS)), group_ms=st.integers(100, DAY_MS))
def test_i27_8_the_rebalance_timeout_in_force_never_exceeds_the_groups(requested: int | None, group_ms: int):
    capped = engine.capped_rebalance_timeout_ms(requested, group_ms)
    assert capped <= group_ms
    assert capped == (group_ms if requested is None else min(requested, group_ms))
