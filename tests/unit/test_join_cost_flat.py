"""Issue 26.2: a join's own work in the core does not grow with the group's size. The target
recompute may (R1b batches it); the join's capacity check (R1) and its batching decision (R1b)
do not walk the group's members."""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from types import FrameType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordination import engine
from coordination.assignor import assign
from coordination.model import Changes, GroupState, Member, MemberStatus, ShardSlot

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


@pytest.mark.parametrize("members", [100, 2000])
def test_i26_2_a_join_into_a_group_at_its_maximum_reads_a_bounded_number_of_members(
        monkeypatch: pytest.MonkeyPatch, members: int):
    """At maxMembers (tombstones fill the rest) the capacity check counts the roster's live
    members. It walked every member per join before: the bench's group is at its maximum."""
    state = make_group(4, rebalance_window_ms=WINDOW_MS, max_members=members + 1)
    for i in range(members):
        Client(state, f"m{i}").join(at(0))
    Client(state, "gone").join(at(0))
    Client(state, "gone").send(member_epoch=-1)  # its tombstone: the dict holds the maximum
    assert len(state.members) == members + 1
    reads = _count_live_reads(monkeypatch)
    assert Client(state, "late").join(at(0.5)).error_code == "NONE"
    assert Client(state, "later").join(at(0.5)).error_code == "GROUP_MAX_SIZE_REACHED"
    assert reads[0] <= 10, f"two joins into {members} members read .live {reads[0]} times"


def test_i26_2_capacity_counts_live_members_once_tombstones_reach_the_maximum():
    """LEFT members (tombstones) do not take a live member's seat."""
    state = make_group(4, max_members=2)
    for name in ("t1", "t2", "t3"):
        Client(state, name).join()
        Client(state, name).send(member_epoch=-1)
    assert all(state.members[n].status == MemberStatus.LEFT for n in ("t1", "t2", "t3"))
    assert Client(state, "a").join().error_code == "NONE"
    assert Client(state, "b").join().error_code == "NONE"
    assert Client(state, "c").join().error_code == "GROUP_MAX_SIZE_REACHED"


# --- the lone join's recompute (issue 26.2: incremental from the roster) ---------------------

def _settled(members: int, shards: int) -> GroupState:
    """A settled group built directly (the engine would take as long as the group is big)."""
    slots = {f"orders:1:{i}": ShardSlot(shard_id=f"orders:1:{i}") for i in range(shards)}
    state = GroupState(name="g", stream="orders", shards=slots, max_members=members + 100,
                       rebalance_window_ms=WINDOW_MS)
    ids = [f"m{i}" for i in range(members)]
    for mid in ids:
        state.members[mid] = Member(member_id=mid, status=MemberStatus.STABLE, member_epoch=1)
    for shard, mid in assign(ids, list(slots), {}).items():
        state.set_target(shard, mid)
        state.grant(shard, mid, 1)
    state.rebalanced_at = at(0)
    return state


def _python_lines(call: Callable[[], object]) -> int:
    """Python lines run by `call`: a count that grows with any Python-level walk and, unlike
    a wall time, does not depend on the machine's load."""
    lines = [0]

    def trace(frame: FrameType, event: str, arg: object) -> Callable[..., object] | None:
        if event == "line":
            lines[0] += 1
        return trace

    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return lines[0]


def test_i26_2_a_lone_join_into_a_settled_group_costs_the_same_at_200_and_at_4000_members():
    """A join into a quiet settled group is targeted at once (not batched) and its recompute
    runs as many Python lines in a group of 4,000 as in one of 200: it reads the roster the
    snapshot keeps (members by target count), not every member. The first recompute of a
    fresh snapshot may file the roster; the measured join is the second, as in a running
    coordinator whose snapshot outlives its heartbeats."""
    cost = {}
    for size in (200, 4000):
        state = _settled(size, 2 * size + size // 3)
        Client(state, "first").join(at(10))  # a fresh snapshot: the roster is filed here
        newcomer = Client(state, "second")
        cost[size] = _python_lines(lambda newcomer=newcomer: newcomer.join(at(20)))
        assert state.rebalance_due_at is None
        assert state.assignment_epoch == state.group_epoch
        assert newcomer.last is not None
        assert newcomer.last.assignment is not None
        got = set(newcomer.last.assignment.pending) | set(newcomer.last.assignment.assigned)
        assert len(got) == 2  # its fair share, taken from the most loaded members
    assert cost[4000] <= cost[200] * 1.2 + 50, cost


member_names = st.sampled_from([f"w{i}" for i in range(10)])
operations = st.lists(st.tuples(st.sampled_from(
    ["join", "static", "leave", "leave-2", "beat", "expire", "reload", "drop", "recompute"]),
    member_names), max_size=40)


def _walked_roster(state: GroupState) -> tuple[set[str], set[str], dict[int, list[str]], list[str]]:
    live = {m.member_id for m in state.members.values() if m.live}
    reserved = {m.member_id for m in state.members.values() if m.temporarily_left}
    buckets: dict[int, list[str]] = {}
    for mid in sorted(live - reserved):
        buckets.setdefault(len(state.target_of(mid)), []).append(mid)
    orphaned = sorted(s.shard_id for s in state.shards.values() if s.target is not None and s.target not in live)
    return live, reserved, buckets, orphaned


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 24), operations)
def test_i26_2_the_roster_matches_a_walk_and_the_recompute_matches_assign(shards: int, ops) -> None:
    """Whatever joins, static joins and replacements (R1s), leaves (R2, R2s), expiries (R8),
    snapshot catch-up (a member row re-read or dropped) and recomputes happen, the roster the
    snapshot keeps equals a walk over the members, and a recompute from it gives `assign`'s
    target: valid, balanced, sticky, deterministic."""
    state = make_group(shards, rebalance_window_ms=0)
    clients = {name: Client(state, name, instance_id=None) for name in [f"w{i}" for i in range(10)]}
    t = 0.0
    for op, name in ops:
        t += 1
        c, member = clients[name], state.members.get(name)
        if op == "join":
            c.instance_id = None
            c.join(at(t))
        elif op == "static":
            c.instance_id = f"inst-{int(name[1:]) % 3}"
            c.join(at(t))
        elif op == "leave":
            c.send(at(t), member_epoch=-1)
        elif op == "leave-2" and member is not None and member.instance_id:
            c.send(at(t), member_epoch=-2, instance_id=member.instance_id)
        elif op == "beat" and member is not None and member.live:
            if c.beat(at(t)).assignment and c.last and c.last.assignment and c.last.assignment.revoking:
                c.revoke_all(at(t))
        elif op == "expire":
            state.changes = Changes()
            engine.r8_remove_members(state, [name], status=MemberStatus.EXPIRED, reason="t", actor="t")
        elif op == "reload" and member is not None:
            state.members[name] = dataclasses.replace(member)  # the catch-up re-reads its row
        elif op == "drop" and member is not None and not member.live:
            state.members.pop(name)  # a tombstone leaves the snapshot
        elif op == "recompute":
            previous = {s.shard_id: s.target for s in state.shards.values() if s.target is not None}
            live, reserved, _, _ = _walked_roster(state)
            expected = assign(sorted(live), sorted(engine.s6_assignable_set(state)), previous, reserved=reserved)
            state.changes = Changes()
            engine.recompute_target(state)
            assert {s.shard_id: s.target for s in state.shards.values() if s.target is not None} == expected
        live, reserved, buckets, orphaned = _walked_roster(state)
        assert state.live_ids() == live
        assert state.reserved_ids() == reserved
        assert state.roster_buckets() == buckets
        assert sorted(state.orphaned_targets()) == orphaned
