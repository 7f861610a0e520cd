"""The heartbeat rules R1–R9 of PROTOCOL.md §4 on the pure core (no database)."""
from __future__ import annotations

import dataclasses

from coordination import engine
from coordination.model import (
    HeartbeatRequest,
    MemberStatus,
    RevokeReport,
    RevokeState,
)

from .engine_helpers import Client, at, make_group, settle


def test_r1_join_grants_free_target_shards_at_the_assignment_epoch():
    state = make_group(4)
    a = Client(state, "a")
    r = a.join()
    assert r.error_code == "NONE" and r.status == "OK"
    assert r.member_epoch == r.assignment_epoch == 2  # groups start at 1; the join raised it
    assert r.assignment.assigned == ("orders:1:0", "orders:1:1", "orders:1:2", "orders:1:3")
    assert r.full_metadata
    assert all(state.shards[s].grant_epoch == 2 for s in r.assignment.assigned)


def test_r1_second_join_gets_pending_until_first_member_revokes():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    r = b.join()
    assert r.status == "OK" and r.assignment.assigned == ()
    assert len(r.assignment.pending) == 2
    ra = a.beat()
    assert ra.status == "REVOKE_PENDING"
    assert set(ra.assignment.revoking) == set(r.assignment.pending)
    assert ra.member_epoch == 2  # R6: epoch unchanged while revoking
    a.revoke_all()
    rb = b.beat()
    assert rb.status == "OK" and set(rb.assignment.assigned) == set(r.assignment.pending)


def test_r1_join_with_owned_shards_is_fenced_and_changes_nothing():
    state = make_group(2)
    r = Client(state, "a").send(owned_shards=("orders:1:0",))
    assert r.error_code == "FENCED_MEMBER_EPOCH" and "ownedShards" in r.error_message
    assert state.members == {} and state.changes.empty


def test_r1_rejoin_releases_everything_the_member_held():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    b.join()
    a.beat()  # a now revoking two shards
    revoking = state.revoking_from("a")
    assert revoking
    r = a.join()  # a restarted: rejoin releases, nothing held any more
    assert r.status == "OK"
    for shard in revoking:
        assert state.shards[shard].owner != "a" or not state.shards[shard].revoking


def test_r1_group_max_size_reached():
    state = make_group(2, max_members=1)
    Client(state, "a").join()
    r = Client(state, "b").join()
    assert r.error_code == "GROUP_MAX_SIZE_REACHED" and r.http_status == 409
    assert "b" not in state.members


def test_r1_rejoin_at_max_size_is_allowed():
    state = make_group(2, max_members=1)
    a = Client(state, "a")
    a.join()
    assert a.join().error_code == "NONE"


def test_r2_leave_releases_shards_and_is_idempotent():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    b.join()
    settle([a, b])
    before = state.group_epoch
    r = a.send(member_epoch=-1)
    assert r.error_code == "NONE" and r.member_epoch == -1
    assert state.group_epoch == before + 1
    assert state.held_by("a") == set()
    again = a.send(member_epoch=-1)
    assert again.error_code == "NONE" and again.member_epoch == -1
    assert state.group_epoch == before + 1
    assert Client(state, "stranger").send(member_epoch=-1).error_code == "NONE"


def test_r3_wrong_epoch_is_fenced():
    state = make_group(2)
    a = Client(state, "a")
    a.join()
    r = a.send(member_epoch=a.epoch + 5)
    assert r.error_code == "FENCED_MEMBER_EPOCH" and r.http_status == 409
    assert state.changes.empty


def test_r3_previous_epoch_accepted_when_owned_is_subset_of_holdings():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    old_epoch = a.epoch
    b.join()
    a.beat()
    a.revoke_all()  # a advances: epoch moves on, response "lost" below
    assert state.members["a"].member_epoch > old_epoch
    prev = state.members["a"].previous_member_epoch
    r = a.send(member_epoch=prev, owned_shards=tuple(sorted(state.granted_to("a"))))
    assert r.error_code == "NONE"
    assert r.member_epoch == state.members["a"].member_epoch


def test_r3_previous_epoch_with_shards_not_held_is_fenced():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    b.join()
    settle([a, b])
    prev = state.members["a"].previous_member_epoch
    r = a.send(member_epoch=prev, owned_shards=tuple(sorted(state.granted_to("b"))))
    assert r.error_code == "FENCED_MEMBER_EPOCH"


def test_r4_owning_another_members_shard_is_fenced():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    b.join()
    settle([a, b])
    theirs = sorted(state.granted_to("b"))[0]
    r = a.send(owned_shards=tuple(a.owned) + (theirs,))
    assert r.error_code == "FENCED_MEMBER_EPOCH" and "owned by another member" in r.error_message
    assert state.changes.empty


def test_r4_owning_a_pending_shard_is_fenced():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    rb = b.join()
    r = b.send(owned_shards=(rb.assignment.pending[0],))
    assert r.error_code == "FENCED_MEMBER_EPOCH"


def test_r4_unknown_shard_is_fenced():
    state = make_group(2)
    a = Client(state, "a")
    a.join()
    r = a.send(owned_shards=("orders:9:9",))
    assert r.error_code == "FENCED_MEMBER_EPOCH" and "not an assignable shard" in r.error_message


def test_r4_granted_shard_missing_from_report_is_fine():
    state = make_group(4)
    a = Client(state, "a")
    a.join()
    r = a.send(owned_shards=())
    assert r.error_code == "NONE" and len(r.assignment.assigned) == 4


def test_r4_revoking_report_for_a_shard_of_another_member_is_fenced():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    b.join()
    settle([a, b])
    theirs = sorted(state.granted_to("b"))[0]
    r = a.send(revoking_shards=(RevokeReport(theirs, RevokeState.REVOKING),))
    assert r.error_code == "FENCED_MEMBER_EPOCH"


def test_r5_revoked_releases_and_duplicate_revoked_is_ignored():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    b.join()
    r = a.beat()
    shard = r.assignment.revoking[0]
    report = (RevokeReport(shard, RevokeState.REVOKED),)
    a.owned = [s for s in a.owned if s != shard]
    assert a.send(revoking_shards=report).error_code == "NONE"
    assert state.shards[shard].owner is None
    dup = a.send(revoking_shards=report)
    assert dup.error_code == "NONE"  # C6: terminal duplicate is ignored, not fenced
    b.beat()
    assert state.shards[shard].owner == "b"
    dup_after_regrant = a.send(revoking_shards=report)
    assert dup_after_regrant.error_code == "NONE"
    assert state.shards[shard].owner == "b"


def test_r5_revoking_state_is_progress_only():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    b.join()
    r = a.beat()
    shard = r.assignment.revoking[0]
    again = a.send(revoking_shards=(RevokeReport(shard, RevokeState.REVOKING),))
    assert again.status == "REVOKE_PENDING"
    assert state.shards[shard].owner == "a" and state.shards[shard].revoking


def test_r6_no_grants_while_revoking():
    state = make_group(6)
    a, b, c = Client(state, "a"), Client(state, "b"), Client(state, "c")
    a.join()
    b.join()
    settle([a, b])
    c.join()
    r = a.beat()
    assert r.status == "REVOKE_PENDING"
    assert not set(r.assignment.assigned) & set(r.assignment.revoking)


def test_r6_reconcile_reaches_balanced_stable_group():
    state = make_group(10)
    clients = [Client(state, f"m{i}") for i in range(3)]
    for c in clients:
        c.join()
    settle(clients)
    sizes = sorted(len(state.granted_to(c.member_id)) for c in clients)
    assert sizes == [3, 3, 4]
    assert all(m.status == MemberStatus.STABLE for m in state.live_members())
    assert engine.group_phase(state) == "STABLE"


def test_r7_stale_metadata_gets_sync_metadata_and_no_new_grants():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    rb = b.join()
    pending = set(rb.assignment.pending)
    a.beat()
    a.revoke_all()
    state.metadata_epoch += 1  # e.g. a reshard began
    r = b.send()
    assert r.status == "SYNC_METADATA" and r.full_metadata
    assert r.assignment.assigned == () and set(r.assignment.pending) == pending
    b.metadata_epoch = state.metadata_epoch
    r2 = b.send()
    assert r2.status == "OK" and set(r2.assignment.assigned) == pending


def test_r7_join_is_not_held_back_by_metadata():
    state = make_group(2)
    state.metadata_epoch = 7
    r = Client(state, "a").join()
    assert r.status == "OK" and len(r.assignment.assigned) == 2


def test_r8_fenced_heartbeat_changes_nothing():
    state = make_group(2)
    a = Client(state, "a")
    a.join()
    snapshot = (state.group_epoch, dataclasses.replace(state.members["a"]))
    r = a.send(member_epoch=99)
    assert r.error_code == "FENCED_MEMBER_EPOCH"
    assert (state.group_epoch, state.members["a"]) == snapshot


def test_r8_operator_fence_removes_member_and_next_heartbeat_is_fenced():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    b.join()
    settle([a, b])
    epoch = state.group_epoch
    removed = engine.r8_remove_members(
        state, ["a"], status=MemberStatus.FENCED, reason="operator", actor="admin", now=at(1)
    )
    assert removed == ["a"] and state.group_epoch == epoch + 1
    assert state.held_by("a") == set()
    assert a.send().error_code == "FENCED_MEMBER_EPOCH"
    assert a.join().error_code == "NONE"


def test_r8_unknown_member_gets_unknown_member_id():
    state = make_group(2)
    r = Client(state, "ghost").send(member_epoch=3)
    assert r.error_code == "UNKNOWN_MEMBER_ID" and r.http_status == 409


def test_r9_shard_never_granted_to_a_new_member_while_old_one_revokes():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    b.join()
    a.beat()  # revoking, not yet REVOKED
    rb = b.beat()
    assert rb.assignment.assigned == ()
    assert engine.owners_are_exclusive(state)


def test_epochs_never_zero_in_responses():
    state = make_group(1)
    r = Client(state, "a").join()
    assert r.member_epoch >= 1 and r.assignment_epoch >= 1


def test_l1_silent_member_expires_and_gets_unknown_member_id():
    state = make_group(4, session_timeout_ms=30_000)
    a, b = Client(state, "a"), Client(state, "b")
    a.join(at(0))
    b.join(at(0))
    settle([a, b], at(1))
    b.beat(at(20))
    assert engine.l1_expire_silent_members(state, at(25)) == []
    assert engine.l1_expire_silent_members(state, at(31.5)) == ["a"]
    assert state.members["a"].status == MemberStatus.EXPIRED
    assert a.send(at(32)).error_code == "UNKNOWN_MEMBER_ID"
    assert engine.l1_expire_silent_members(state, at(32)) == []  # L3: idempotent


def test_l2_member_that_does_not_revoke_in_time_is_fenced():
    state = make_group(4, rebalance_timeout_ms=60_000)
    a, b = Client(state, "a"), Client(state, "b")
    a.join(at(0))
    b.join(at(0))
    a.send(at(1))
    a.send(at(2), member_epoch=a.epoch)  # still no REVOKED
    assert engine.l2_fence_overdue_revocations(state, at(60)) == []
    assert engine.l2_fence_overdue_revocations(state, at(61.5)) == ["a"]
    assert a.send(at(62)).error_code == "FENCED_MEMBER_EPOCH"
    assert b.beat(at(62)).assignment.assigned  # b got the shards a held


def test_s6_child_not_assignable_until_all_parents_drained():
    state = make_group(2)
    from coordination.model import ShardSlot
    for i, parents in enumerate([("orders:1:0",), ("orders:1:0", "orders:1:1"), ("orders:1:1",)]):
        state.shards[f"orders:2:{i}"] = ShardSlot(shard_id=f"orders:2:{i}", parents=parents)
    state.__post_init__()
    assert set(engine.s6_assignable(state)) == {"orders:1:0", "orders:1:1"}
    state.shards["orders:1:0"].drained = True
    assert set(engine.s6_assignable(state)) == {"orders:1:1", "orders:2:0"}
    state.shards["orders:1:1"].drained = True
    assert set(engine.s6_assignable(state)) == {"orders:2:0", "orders:2:1", "orders:2:2"}


def test_s6_drained_report_only_counts_for_sealed_shards_the_member_holds():
    state = make_group(2)
    a = Client(state, "a")
    a.join()
    r = a.send(drained_shards=("orders:1:0",))
    assert r.error_code == "NONE" and not state.shards["orders:1:0"].drained  # not sealed
    state.shards["orders:1:0"].sealed = True
    epoch = state.group_epoch
    r = a.send(drained_shards=("orders:1:0",))
    assert state.shards["orders:1:0"].drained and state.group_epoch == epoch + 1
    assert r.status == "REVOKE_PENDING" and r.assignment.revoking == ("orders:1:0",)


def test_s6_one_drained_event_per_group_and_version_when_its_last_shard_drains():
    state = make_group(3)
    a = Client(state, "a")
    a.join()
    for slot in state.shards.values():
        slot.sealed = True
    a.send(drained_shards=("orders:1:0", "orders:1:1"))
    assert [e.kind for e in state.changes.events if e.kind == "drained"] == []  # one shard still to go
    a.send(drained_shards=("orders:1:2",))
    drained = [e for e in state.changes.events if e.kind == "drained"]
    assert len(drained) == 1 and drained[0].member_id == ""
    assert drained[0].detail == {"version": 1, "shards": 3, "lastMember": "a"}


def test_request_defaults_are_a_regular_heartbeat():
    req = HeartbeatRequest(member_id="m", member_epoch=1)
    assert req.owned_shards is None and req.revoking_shards == ()


def test_partial_snapshot_refuses_to_recompute_the_target():
    import pytest

    state = make_group(2)
    state.partial = True
    with pytest.raises(RuntimeError, match="partial"):
        engine.recompute_target(state)
    assert engine.needs_full_state(HeartbeatRequest(member_id="m", member_epoch=0))
    assert engine.needs_full_state(HeartbeatRequest(member_id="m", member_epoch=-1))
    assert engine.needs_full_state(HeartbeatRequest(member_id="m", member_epoch=3, drained_shards=("s:1:0",)))
    assert not engine.needs_full_state(HeartbeatRequest(member_id="m", member_epoch=3))
