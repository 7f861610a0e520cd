"""Issue 26.2: a join's own work in the core does not grow with the group's size. The target
recompute may (R1b batches it); the join's capacity check (R1) and its batching decision (R1b)
do not walk the group's members."""
from __future__ import annotations

import pytest

from coordination.model import Member, MemberStatus

from .engine_helpers import Client, at, make_group

WINDOW_MS = 1000


def _count_live_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads = [0]
    live = Member.live

    def counted(self: Member) -> bool:
        reads[0] += 1
        return live.fget(self)  # type: ignore[attr-defined,no-any-return]

    monkeypatch.setattr(Member, "live", property(counted))
    return reads


@pytest.mark.parametrize("members", [100, 2000])
def test_i26_2_a_batched_join_reads_a_bounded_number_of_members(monkeypatch: pytest.MonkeyPatch, members: int):
    state = make_group(4, rebalance_window_ms=WINDOW_MS, max_members=members + 10)
    for i in range(members):
        Client(state, f"m{i}").join(at(0))  # one storm: every join waits for the window's recompute
    reads = _count_live_reads(monkeypatch)
    r = Client(state, "late").join(at(0.5))
    assert r.error_code == "NONE"
    assert state.rebalance_due_at is not None  # batched: the recompute (which may grow) waits
    assert reads[0] <= 5, f"a join into {members} members read .live {reads[0]} times"


def test_i26_2_a_quiet_groups_lone_join_still_sees_the_other_live_members():
    """R1b's "alone" test stops at the first other live member but still finds one: a join into
    a quiet group with members is targeted at once; the first join of an empty group waits."""
    state = make_group(4, rebalance_window_ms=WINDOW_MS)
    a = Client(state, "a")
    first = a.join(at(0))
    assert state.rebalance_due_at is not None
    assert first.assignment.assigned == ()
    a.beat(at(1))  # the window's recompute
    assert state.rebalance_due_at is None
    Client(state, "b").join(at(5))  # quiet, not alone: at once
    assert state.rebalance_due_at is None
    assert state.assignment_epoch == state.group_epoch


def test_i26_2_capacity_counts_live_members_once_tombstones_reach_the_maximum():
    """Without a walk while fewer members of any status than the maximum exist; with one when
    LEFT members (tombstones) fill the dict: they do not take a live member's seat."""
    state = make_group(4, max_members=2)
    for name in ("t1", "t2", "t3"):
        Client(state, name).join()
        Client(state, name).send(member_epoch=-1)
    assert all(state.members[n].status == MemberStatus.LEFT for n in ("t1", "t2", "t3"))
    assert Client(state, "a").join().error_code == "NONE"
    assert Client(state, "b").join().error_code == "NONE"
    assert Client(state, "c").join().error_code == "GROUP_MAX_SIZE_REACHED"
