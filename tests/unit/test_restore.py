"""coordination.restore: after a database restore, grant epochs only rise (§7 fence tokens)."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coordination.restore import parse_fence_epoch, raise_epochs_above

from .engine_helpers import Client, make_group


@given(joins=st.integers(0, 3), floor=st.integers(0, 10_000))
def test_restore_raise_puts_every_later_grant_above_the_floor_and_lowers_nothing(joins: int, floor: int):
    state = make_group(shards=4)
    members = [Client(state, f"m{i}") for i in range(joins)]
    for m in members:
        m.join()
    before = (state.group_epoch, state.assignment_epoch)
    changed = raise_epochs_above(state, floor)
    assert changed == (before[1] <= floor)
    assert (state.assignment_epoch > floor and state.group_epoch == state.assignment_epoch) or not changed
    assert state.group_epoch >= before[0]
    assert state.assignment_epoch >= before[1]
    # The restored members are gone (stopped, then left or expired); a new one takes over and
    # is granted every shard at an epoch above every token in Redis.
    for m in members:
        m.send(member_epoch=-1)
    new = Client(state, "new")
    new.join()
    for _ in range(3):
        new.beat()
    assert sorted(new.owned) == sorted(state.shards)
    assert all(slot.grant_epoch > floor for slot in state.shards.values())


def test_restore_parse_fence_epoch_reads_grant_epoch_member_tokens_only():
    assert parse_fence_epoch("57:m-1") == 57
    assert parse_fence_epoch("57:m:with:colons") == 57
    assert parse_fence_epoch("junk") is None
    assert parse_fence_epoch("x:m") is None
    assert parse_fence_epoch(":m") is None
