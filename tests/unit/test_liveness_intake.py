"""L1/L2 count only silence the coordinator could have heard (issue 8.1, the intake beacon)."""
from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from coordination import engine
from coordination.engine import Intake
from coordination.model import MemberStatus

from .engine_helpers import Client, at, make_group, settle

GAP_MS = 5_000


def beacon(up_since: float, last: float) -> Intake:
    return Intake(up_since=at(up_since), last_beacon=at(last), max_gap_ms=GAP_MS)


def two_settled_members(**config: int) -> tuple[Client, Client]:
    state = make_group(4, **config)
    a, b = Client(state, "a"), Client(state, "b")
    a.join(at(0))
    b.join(at(0))
    settle([a, b], at(1))
    return a, b


def test_l1_sweep_while_the_intake_is_down_expires_nobody():
    a, _ = two_settled_members(session_timeout_ms=30_000)
    # Intake last stamped at 10 s; the sweep at 100 s sees a 90 s gap: the intake is down.
    assert engine.l1_expire_silent_members(a.state, at(100), beacon(0, 10)) == []
    assert all(m.live for m in a.state.members.values())


def test_l1_after_the_intake_returns_members_get_one_full_session():
    a, b = two_settled_members(session_timeout_ms=30_000)
    back = beacon(up_since=200, last=229)  # outage from ~10 s to 200 s, then stamped every second
    assert engine.l1_expire_silent_members(a.state, at(229), back) == []
    b.beat(at(225))
    # A full session after the intake came back: the still-silent member expires, not b.
    assert engine.l1_expire_silent_members(a.state, at(230.5), beacon(200, 230.4)) == ["a"]
    assert a.state.members["a"].status == MemberStatus.EXPIRED
    assert a.state.members["b"].live


def test_l1_silence_heard_before_the_outage_still_counts_when_the_intake_stayed_up():
    a, b = two_settled_members(session_timeout_ms=30_000)
    b.beat(at(20))
    # Intake up since before the last heartbeat: the old rule, counted from lastHeartbeat.
    assert engine.l1_expire_silent_members(a.state, at(31.5), beacon(-100, 31)) == ["a"]


def test_l1_unrecorded_intake_counts_from_the_last_heartbeat():
    a, b = two_settled_members(session_timeout_ms=30_000)
    b.beat(at(20))
    assert engine.l1_expire_silent_members(a.state, at(31.5), Intake()) == ["a"]


def test_l1_every_member_really_dead_still_expires_while_the_beacon_says_up():
    a, _ = two_settled_members(session_timeout_ms=30_000)
    # The beacon keeps beating without any heartbeat arriving.
    assert sorted(engine.l1_expire_silent_members(a.state, at(40), beacon(-100, 39.5))) == ["a", "b"]


def revoking_member(rebalance_timeout_ms: int) -> Client:
    state = make_group(4, rebalance_timeout_ms=rebalance_timeout_ms)
    a, b = Client(state, "a"), Client(state, "b")
    a.join(at(0))
    b.join(at(0))
    a.send(at(1))  # a is told to revoke; deadline 61 s
    assert state.members["a"].revocation_deadline == at(61)
    return a


def test_l2_sweep_while_the_intake_is_down_fences_nobody():
    a = revoking_member(60_000)
    assert engine.l2_fence_overdue_revocations(a.state, at(120), beacon(-100, 50)) == []


def test_l2_after_the_intake_returns_a_revoking_member_gets_a_full_rebalance_timeout():
    a = revoking_member(60_000)
    # Intake back at 100 s: the deadline (61 s) passed during the outage; 60 s more to report.
    assert engine.l2_fence_overdue_revocations(a.state, at(159), beacon(100, 159)) == []
    assert engine.l2_fence_overdue_revocations(a.state, at(160.5), beacon(100, 160)) == ["a"]


def test_l2_deadline_unchanged_when_the_intake_stayed_up():
    a = revoking_member(60_000)
    assert engine.l2_fence_overdue_revocations(a.state, at(61.5), beacon(-100, 61)) == ["a"]


@given(
    last_heard=st.floats(0, 1_000),
    up_since=st.floats(0, 1_000),
    now=st.floats(0, 2_000),
    last_beacon=st.floats(0, 2_000),
)
def test_l1_expires_only_for_audible_silence_longer_than_the_session(
    last_heard: float, up_since: float, now: float, last_beacon: float
):
    state = make_group(2, session_timeout_ms=30_000)
    a = Client(state, "a")
    a.join(at(last_heard))
    intake = beacon(up_since, min(last_beacon, now))
    expired = engine.l1_expire_silent_members(state, at(now), intake)
    gap = now - min(last_beacon, now)
    audible_silence = now - max(last_heard, up_since)
    assert bool(expired) == (gap * 1000 <= GAP_MS and audible_silence * 1000 > 30_000)


def test_intake_audible_since_is_the_later_of_last_heard_and_up_since():
    i = beacon(up_since=10, last=10)
    heard: datetime = at(5)
    assert i.audible_since(heard) == at(10)
    assert i.audible_since(heard + timedelta(seconds=10)) == at(15)
    assert i.audible_since(None) == at(10)
