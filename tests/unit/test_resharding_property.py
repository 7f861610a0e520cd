"""§6 properties of resharding, pure (no DB): parents are exactly the overlapping ranges, and
no child becomes assignable (or is granted) while a parent overlapping its range is undrained."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordination import engine
from coordination.model import GroupState, ShardSlot
from dataplane.routing import hash_range, parent_indexes, shard_id

from .engine_helpers import Client, settle

counts = st.integers(min_value=1, max_value=24)


def overlapping(child: int, new_count: int, old_count: int) -> set[int]:
    """Brute force: old shards whose [lo, hi) intersects the child's [lo, hi)."""
    lo, hi = hash_range(child, new_count)
    out = set()
    for i in range(old_count):
        plo, phi = hash_range(i, old_count)
        if plo < hi and lo < phi:
            out.add(i)
    return out


def resharded_group(old_count: int, new_count: int, *, sealed: bool = True) -> GroupState:
    """A group holding version 1 (old_count shards, sealed) and version 2 (new_count) with links."""
    slots = {shard_id("s", 1, i): ShardSlot(shard_id("s", 1, i), sealed=sealed) for i in range(old_count)}
    for j in range(new_count):
        parents = tuple(shard_id("s", 1, p) for p in parent_indexes(j, new_count, old_count))
        slots[shard_id("s", 2, j)] = ShardSlot(shard_id("s", 2, j), parents=parents)
    return GroupState(name="g", stream="s", shards=slots)


def undrained_overlap(state: GroupState, child: str, old_count: int, new_count: int) -> set[int]:
    index = int(child.rsplit(":", 1)[1])
    return {p for p in overlapping(index, new_count, old_count) if not state.shards[shard_id("s", 1, p)].drained}


@given(old=counts, new=counts)
def test_s6_parent_links_are_exactly_the_overlapping_ranges(old: int, new: int) -> None:
    for j in range(new):
        assert set(parent_indexes(j, new, old)) == overlapping(j, new, old)


@given(old=counts, new=counts, data=st.data())
def test_s6_no_child_assignable_while_an_overlapping_parent_is_undrained(old: int, new: int, data: st.DataObject) -> None:
    state = resharded_group(old, new)
    order = data.draw(st.permutations(range(old)))
    stop = data.draw(st.integers(min_value=0, max_value=old))
    for step in range(stop + 1):
        assignable = set(engine.s6_assignable(state))
        for j in range(new):
            child = shard_id("s", 2, j)
            # Safety (never early) and liveness (assignable as soon as all are drained).
            assert (child in assignable) == (not undrained_overlap(state, child, old, new))
        for i in range(old):
            parent = shard_id("s", 1, i)
            assert (parent in assignable) == (not state.shards[parent].drained)
        if step < stop:
            state.mark_drained(shard_id("s", 1, order[step]))


@settings(max_examples=60, deadline=None)
@given(old=counts, new=counts, members=st.integers(min_value=1, max_value=4), data=st.data())
def test_s6_members_never_hold_a_child_before_its_overlapping_parents_drain(
    old: int, new: int, members: int, data: st.DataObject
) -> None:
    """Through the engine: members drain random parents in random order; after every heartbeat
    no member holds a child whose overlapping parent is undrained, and R9 holds."""
    state = resharded_group(old, new)
    engine.recompute_target(state)
    clients = [Client(state, f"m{k}") for k in range(members)]
    for c in clients:
        c.join()
    settle(clients)

    def check() -> None:
        assert engine.owners_are_exclusive(state)
        for c in clients:
            for shard in state.held_by(c.member_id) | set(c.owned):
                if shard.startswith("s:2:"):
                    assert not undrained_overlap(state, shard, old, new), (shard, c.member_id)

    check()
    for _ in range(old):
        undrained = sorted(
            (s for s in state.shards if s.startswith("s:1:") and not state.shards[s].drained),
            key=lambda s: int(s.rsplit(":", 1)[1]),
        )
        if not undrained:
            break
        parent = data.draw(st.sampled_from(undrained))
        owner = state.shards[parent].owner
        assert owner is not None  # settled: every assignable shard is held
        c = next(c for c in clients if c.member_id == owner)
        c._apply(c.send(drained_shards=(parent,)))
        check()
        for other in data.draw(st.permutations(clients)):
            r = other.beat()
            check()
            if r.assignment and r.assignment.revoking:
                other.revoke_all()
                check()
        settle(clients)
        check()
    # Everything drained: the group ends on the new version alone, fully granted.
    assert {s for c in clients for s in state.held_by(c.member_id)} == {shard_id("s", 2, j) for j in range(new)}


def test_s6_drained_report_before_the_seal_is_ignored() -> None:
    state = resharded_group(2, 4, sealed=False)
    engine.recompute_target(state)
    c = Client(state, "m")
    c.join()
    c._apply(c.send(drained_shards=("s:1:0",)))
    assert not state.shards["s:1:0"].drained
    assert "s:2:0" not in engine.s6_assignable(state)


def test_s6_refresh_assignable_recomputes_only_when_the_assignable_set_moved() -> None:
    state = resharded_group(2, 2)
    engine.recompute_target(state)
    c = Client(state, "m")
    c.join()
    epoch = state.group_epoch
    assert not engine.s6_refresh_assignable(state)
    assert state.group_epoch == epoch
    state.shards["s:1:0"].drained = True  # as if loaded so, e.g. a slot repaired under it
    assert engine.s6_refresh_assignable(state)
    assert state.group_epoch == epoch + 1
    assert state.shards["s:2:0"].target == "m"
    assert state.shards["s:1:0"].target is None
