"""The heartbeat rules R1–R9 of PROTOCOL.md §4 on the pure core (no database)."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from coordination import engine
from coordination.model import (
    HeartbeatRequest,
    MemberStatus,
    RevokeReport,
)
from dataplane.protocol import (
    INSTANCE_REPLACED_MARKER,
    ErrorCode,
    InstanceReplaced,
    RevokeState,
    instance_replaced,
)

from .engine_helpers import Client, at, group_with, make_group, settle


def test_r1_join_grants_free_target_shards_at_the_assignment_epoch():
    state = make_group(4)
    a = Client(state, "a")
    r = a.join()
    assert r.error_code == "NONE"
    assert r.status == "OK"
    assert r.member_epoch == r.assignment_epoch == 2  # groups start at 1; the join raised it
    assert r.assignment.assigned == ("orders:1:0", "orders:1:1", "orders:1:2", "orders:1:3")
    assert r.full_metadata
    assert all(state.shards[s].grant_epoch == 2 for s in r.assignment.assigned)


def test_r1_second_join_gets_pending_until_first_member_revokes():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    r = b.join()
    assert r.status == "OK"
    assert r.assignment.assigned == ()
    assert len(r.assignment.pending) == 2
    ra = a.beat()
    assert ra.status == "REVOKE_PENDING"
    assert set(ra.assignment.revoking) == set(r.assignment.pending)
    assert ra.member_epoch == 2  # R6: epoch unchanged while revoking
    a.revoke_all()
    rb = b.beat()
    assert rb.status == "OK"
    assert set(rb.assignment.assigned) == set(r.assignment.pending)


def test_r1_join_with_owned_shards_is_fenced_and_changes_nothing():
    state = make_group(2)
    r = Client(state, "a").send(owned_shards=("orders:1:0",))
    assert r.error_code == "FENCED_MEMBER_EPOCH"
    assert "ownedShards" in r.error_message
    assert state.members == {}
    assert state.changes.empty


def test_r1_rejoin_releases_everything_the_member_held():
    state, (a, _b) = group_with(["a", "b"], 4, settled=False)
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
    assert r.error_code == "GROUP_MAX_SIZE_REACHED"
    assert r.http_status == 409
    assert "b" not in state.members


def test_r1_rejoin_at_max_size_is_allowed():
    state = make_group(2, max_members=1)
    a = Client(state, "a")
    a.join()
    assert a.join().error_code == "NONE"


def test_r2_leave_releases_shards_and_is_idempotent():
    state, (a, _b) = group_with(["a", "b"], 4)
    before = state.group_epoch
    r = a.send(member_epoch=-1)
    assert r.error_code == "NONE"
    assert r.member_epoch == -1
    assert state.group_epoch == before + 1
    assert state.held_by("a") == set()
    again = a.send(member_epoch=-1)
    assert again.error_code == "NONE"
    assert again.member_epoch == -1
    assert state.group_epoch == before + 1
    assert Client(state, "stranger").send(member_epoch=-1).error_code == "NONE"


def test_r3_wrong_epoch_is_fenced():
    state, (a,) = group_with(["a"], 2, settled=False)
    r = a.send(member_epoch=a.epoch + 5)
    assert r.error_code == "FENCED_MEMBER_EPOCH"
    assert r.http_status == 409
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
    state, (a, _b) = group_with(["a", "b"], 4)
    prev = state.members["a"].previous_member_epoch
    r = a.send(member_epoch=prev, owned_shards=tuple(sorted(state.granted_to("b"))))
    assert r.error_code == "FENCED_MEMBER_EPOCH"


def test_r4_owning_another_members_shard_is_fenced():
    state, (a, _b) = group_with(["a", "b"], 4)
    theirs = sorted(state.granted_to("b"))[0]
    r = a.send(owned_shards=(*tuple(a.owned), theirs))
    assert r.error_code == "FENCED_MEMBER_EPOCH"
    assert "owned by another member" in r.error_message
    assert state.changes.empty


def test_r4_owning_a_pending_shard_is_fenced():
    state = make_group(4)
    a, b = Client(state, "a"), Client(state, "b")
    a.join()
    rb = b.join()
    r = b.send(owned_shards=(rb.assignment.pending[0],))
    assert r.error_code == "FENCED_MEMBER_EPOCH"


def test_r4_unknown_shard_is_fenced():
    _state, (a,) = group_with(["a"], 2, settled=False)
    r = a.send(owned_shards=("orders:9:9",))
    assert r.error_code == "FENCED_MEMBER_EPOCH"
    assert "not an assignable shard" in r.error_message


def test_r4_granted_shard_missing_from_report_is_fine():
    _state, (a,) = group_with(["a"], 4, settled=False)
    r = a.send(owned_shards=())
    assert r.error_code == "NONE"
    assert len(r.assignment.assigned) == 4


def test_r4_revoking_report_for_a_shard_of_another_member_is_fenced():
    state, (a, _b) = group_with(["a", "b"], 4)
    theirs = sorted(state.granted_to("b"))[0]
    r = a.send(revoking_shards=(RevokeReport(theirs, RevokeState.REVOKING),))
    assert r.error_code == "FENCED_MEMBER_EPOCH"


def test_r5_revoked_releases_and_duplicate_revoked_is_ignored():
    state, (a, b) = group_with(["a", "b"], 4, settled=False)
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
    state, (a, _b) = group_with(["a", "b"], 4, settled=False)
    r = a.beat()
    shard = r.assignment.revoking[0]
    again = a.send(revoking_shards=(RevokeReport(shard, RevokeState.REVOKING),))
    assert again.status == "REVOKE_PENDING"
    assert state.shards[shard].owner == "a"
    assert state.shards[shard].revoking


def test_r6_no_grants_while_revoking():
    state, (a, _b) = group_with(["a", "b"], 6)
    c = Client(state, "c")
    c.join()
    r = a.beat()
    assert r.status == "REVOKE_PENDING"
    assert not set(r.assignment.assigned) & set(r.assignment.revoking)


def test_r6_reconcile_reaches_balanced_stable_group():
    state, clients = group_with(["m0", "m1", "m2"], 10)
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
    assert r.status == "SYNC_METADATA"
    assert r.full_metadata
    assert r.assignment.assigned == ()
    assert set(r.assignment.pending) == pending
    b.metadata_epoch = state.metadata_epoch
    r2 = b.send()
    assert r2.status == "OK"
    assert set(r2.assignment.assigned) == pending


def test_r7_join_is_not_held_back_by_metadata():
    state = make_group(2)
    state.metadata_epoch = 7
    r = Client(state, "a").join()
    assert r.status == "OK"
    assert len(r.assignment.assigned) == 2


def test_r8_fenced_heartbeat_changes_nothing():
    state, (a,) = group_with(["a"], 2, settled=False)
    snapshot = (state.group_epoch, dataclasses.replace(state.members["a"]))
    r = a.send(member_epoch=99)
    assert r.error_code == "FENCED_MEMBER_EPOCH"
    assert (state.group_epoch, state.members["a"]) == snapshot


def test_r8_operator_fence_removes_member_and_next_heartbeat_is_fenced():
    state, (a, _b) = group_with(["a", "b"], 4)
    epoch = state.group_epoch
    removed = engine.r8_remove_members(
        state, ["a"], status=MemberStatus.FENCED, reason="operator", actor="admin"
    )
    assert removed == ["a"]
    assert state.group_epoch == epoch + 1
    assert state.held_by("a") == set()
    assert a.send().error_code == "FENCED_MEMBER_EPOCH"
    assert a.join().error_code == "NONE"


def test_r8_unknown_member_gets_unknown_member_id():
    state = make_group(2)
    r = Client(state, "ghost").send(member_epoch=3)
    assert r.error_code == "UNKNOWN_MEMBER_ID"
    assert r.http_status == 409


def test_r9_shard_never_granted_to_a_new_member_while_old_one_revokes():
    state, (a, b) = group_with(["a", "b"], 4, settled=False)
    a.beat()  # revoking, not yet REVOKED
    rb = b.beat()
    assert rb.assignment.assigned == ()
    assert engine.owners_are_exclusive(state)


def test_epochs_never_zero_in_responses():
    state = make_group(1)
    r = Client(state, "a").join()
    assert r.member_epoch >= 1
    assert r.assignment_epoch >= 1


def test_l1_silent_member_expires_and_gets_unknown_member_id():
    state, (a, b) = group_with(["a", "b"], session_timeout_ms=30_000, joined_at=at(0), settled_at=at(1))
    b.beat(at(20))
    assert engine.l1_expire_silent_members(state, at(25)) == []
    assert engine.l1_expire_silent_members(state, at(31.5)) == ["a"]
    assert state.members["a"].status == MemberStatus.EXPIRED
    assert a.send(at(32)).error_code == "UNKNOWN_MEMBER_ID"
    assert engine.l1_expire_silent_members(state, at(32)) == []  # L3: idempotent


def test_l2_member_that_does_not_revoke_in_time_is_fenced():
    state, (a, b) = group_with(["a", "b"], rebalance_timeout_ms=60_000, joined_at=at(0), settled=False)
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
    state, (a,) = group_with(["a"], 2, settled=False)
    r = a.send(drained_shards=("orders:1:0",))
    assert r.error_code == "NONE"
    assert not state.shards["orders:1:0"].drained
    state.shards["orders:1:0"].sealed = True
    epoch = state.group_epoch
    r = a.send(drained_shards=("orders:1:0",))
    assert state.shards["orders:1:0"].drained
    assert state.group_epoch == epoch + 1
    assert r.status == "REVOKE_PENDING"
    assert r.assignment.revoking == ("orders:1:0",)


def test_s6_one_drained_event_per_group_and_version_when_its_last_shard_drains():
    state, (a,) = group_with(["a"], 3, settled=False)
    for slot in state.shards.values():
        slot.sealed = True
    a.send(drained_shards=("orders:1:0", "orders:1:1"))
    assert [e.kind for e in state.changes.events if e.kind == "drained"] == []  # one shard still to go
    a.send(drained_shards=("orders:1:2",))
    drained = [e for e in state.changes.events if e.kind == "drained"]
    assert len(drained) == 1
    assert drained[0].member_id == ""
    assert drained[0].detail == {"version": 1, "shards": 3, "lastMember": "a"}


def test_request_defaults_are_a_regular_heartbeat():
    req = HeartbeatRequest(member_id="m", member_epoch=1)
    assert req.owned_shards is None
    assert req.revoking_shards == ()


# --- §9 static membership: R1s, R2s, L1s -------------------------------------------------------
def _static_group(members: int = 4, shards: int = 8, **config: int):
    return group_with([f"m{i}" for i in range(members)], shards, joined_at=at(0), settled_at=at(1),
                      instance_ids=[f"inst-{i}" for i in range(members)], **config)


def _targets(state) -> dict[str, str | None]:
    return {sid: slot.target for sid, slot in state.shards.items()}


def test_r2s_temporary_leave_keeps_shards_and_target_reserved_without_recompute():
    state, (a, b, c, d) = _static_group()
    held, targets, epoch = set(state.granted_to("m0")), _targets(state), state.group_epoch
    r = a.send(at(2), member_epoch=-2)
    assert r.error_code == "NONE"
    assert r.member_epoch == -2
    assert r.assignment.assigned == ()
    assert state.members["m0"].status == MemberStatus.TEMPORARILY_LEFT
    assert state.group_epoch == epoch
    assert _targets(state) == targets
    assert state.granted_to("m0") == held  # still owned: granted to nobody else
    for other in (b, c, d):
        assert not set(other.beat(at(3)).assignment.assigned) & held
    assert engine.group_phase(state) == "STABLE"


def test_r2s_without_instance_id_is_invalid_request_naming_member_epoch():
    state, (a,) = group_with(["a"], 4, settled=False)
    state.changes = type(state.changes)()
    r = a.send(member_epoch=-2)
    assert r.error_code == "INVALID_REQUEST"
    assert r.http_status == 400
    assert r.error_message.startswith("memberEpoch")
    assert state.members["a"].status != MemberStatus.TEMPORARILY_LEFT
    assert state.changes.empty
    assert Client(state, "stranger").send(member_epoch=-2).error_code == "INVALID_REQUEST"


def test_r2s_with_another_instance_id_is_invalid_request():
    _state, (a, *_) = _static_group(2, 4)
    r = a.send(member_epoch=-2, instance_id="not-mine")
    assert r.error_code == "INVALID_REQUEST"
    assert r.error_message.startswith("instanceId")


def test_r2s_is_idempotent_and_a_later_regular_heartbeat_gets_unknown_member_id():
    state, (a, *_) = _static_group(2, 4)
    a.send(at(2), member_epoch=-2)
    state.changes = type(state.changes)()
    again = a.send(at(5), member_epoch=-2, instance_id=None)
    assert again.error_code == "NONE"
    assert again.member_epoch == -2
    assert state.changes.empty
    assert state.members["m0"].last_heartbeat_at == at(2)
    r = a.send(at(6))
    assert r.error_code == "UNKNOWN_MEMBER_ID"
    assert "temporarily left" in r.error_message


def test_r2s_releases_what_the_member_was_still_revoking():
    state, (a, _b) = _static_group(2, 6)
    c = Client(state, "c")
    c.join(at(2))
    r = a.beat(at(3))
    assert r.status == "REVOKE_PENDING"
    assert r.assignment.revoking
    a.send(at(4), member_epoch=-2)  # C1 done for every shard before a static member stops
    assert state.revoking_from("m0") == set()
    assert set(c.beat(at(5)).assignment.assigned) >= set(r.assignment.revoking)


def test_r2s_a_join_while_a_member_is_away_keeps_its_target_reserved():
    state, (a, b, c, d) = _static_group()
    reserved = set(state.target_of("m3"))  # the last id: a plain rebalance would take one
    d.send(at(2), member_epoch=-2)
    e = Client(state, "e")
    e.join(at(3))
    settle([a, b, c, e], at(4))
    assert state.target_of("m3") == reserved
    assert state.granted_to("m3") == reserved
    assert sorted(len(state.target_of(m.member_id)) for m in (a, b, c, e)) == [1, 1, 2, 2]
    assert engine.owners_are_exclusive(state)


def test_r1s_rejoin_after_temporary_leave_gets_the_same_shards_at_a_higher_grant_epoch():
    state, (a, b, c, d) = _static_group()
    held = set(state.granted_to("m0"))
    fence_tokens = {s: state.shards[s].grant_epoch for s in held}
    targets, epoch = _targets(state), state.group_epoch
    a.send(at(2), member_epoch=-2)
    a2 = Client(state, "m0-restarted", instance_id="inst-0")
    r = a2.join(at(3))
    assert r.error_code == "NONE"
    assert r.status == "OK"
    assert set(r.assignment.assigned) == held
    assert r.assignment.pending == ()
    assert state.group_epoch == epoch + 1 == state.assignment_epoch
    assert all(state.shards[s].grant_epoch > fence_tokens[s] for s in held)
    assert _targets(state) == {s: ("m0-restarted" if t == "m0" else t) for s, t in targets.items()}
    settle([a2, b, c, d], at(4))
    assert state.granted_to("m0-restarted") == held
    assert a.send(at(5), member_epoch=a.epoch).error_code == "UNKNOWN_MEMBER_ID"


def test_r1s_duplicate_instance_replaces_the_live_member():
    state, (a, b, c, d) = _static_group()
    held = set(state.granted_to("m0"))
    others = {m.member_id: set(state.target_of(m.member_id)) for m in (b, c, d)}
    dup = Client(state, "m0-duplicate", instance_id="inst-0")
    r = dup.join(at(2))
    assert set(r.assignment.assigned) == held
    assert state.members["m0"].status == MemberStatus.LEFT
    stale = a.beat(at(3))
    assert stale.error_code == "UNKNOWN_MEMBER_ID"
    assert "replaced" in stale.error_message
    assert {mid: set(state.target_of(mid)) for mid in others} == others
    assert [m.member_id for m in state.live_members() if m.instance_id == "inst-0"] == ["m0-duplicate"]


def test_r1s_replaced_member_is_told_so_by_the_marker_and_an_expired_one_is_not():
    """The old incarnation's UNKNOWN_MEMBER_ID starts with the protocol's marker, naming the
    instanceId and the new memberId, so its data plane stops instead of rejoining (C5)."""
    state, (a, b, c, _d) = _static_group()
    Client(state, "m0-duplicate", instance_id="inst-0").join(at(2))
    stale = a.beat(at(3))
    assert stale.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert stale.error_message.startswith(INSTANCE_REPLACED_MARKER)
    assert instance_replaced(stale.error_message) == InstanceReplaced("inst-0", "m0-duplicate")
    b.send(at(4), member_epoch=-1)
    assert "m2" in engine.l1_expire_silent_members(state, at(100))
    assert state.members["m2"].status == MemberStatus.EXPIRED
    for member in (b, c, Client(state, "stranger")):  # left, expired, never joined: no marker
        r = member.send(at(101), member_epoch=3)
        assert r.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        assert instance_replaced(r.error_message) is None


def test_r1s_same_member_id_rejoin_fences_its_stale_epoch():
    state, (a, *_) = _static_group(2, 4)
    held, stale_epoch = set(state.granted_to("m0")), a.epoch
    r = a.join(at(2))
    assert set(r.assignment.assigned) == held
    assert r.member_epoch > stale_epoch
    late = a.send(at(3), member_epoch=stale_epoch, owned_shards=tuple(sorted(held)))
    assert late.error_code == "FENCED_MEMBER_EPOCH"


def test_r1s_gets_pending_shards_of_the_old_target_only_when_released():
    state, (a, b) = _static_group(2, 4)
    c = Client(state, "c", instance_id="inst-c")
    rc = c.join(at(2))  # pending: b and a still hold them
    assert rc.assignment.pending
    c2 = Client(state, "c2", instance_id="inst-c")
    r = c2.join(at(3))
    assert set(r.assignment.pending) == set(rc.assignment.pending)
    assert r.assignment.assigned == ()
    settle([a, b, c2], at(4))
    assert state.granted_to("c2") == set(rc.assignment.pending)


def test_r1s_by_another_live_member_rebalances_only_that_members_shards():
    state, (_a, b, _c, _d) = _static_group()
    reserved = set(state.target_of("m0"))
    r = b.send(at(2), member_epoch=0, owned_shards=(), instance_id="inst-0")  # m1 now claims inst-0
    assert r.error_code == "NONE"
    assert state.target_of("m1") == reserved
    assert state.members["m0"].status == MemberStatus.LEFT
    assert sorted(len(state.target_of(m)) for m in ("m1", "m2", "m3")) == [2, 3, 3]


def test_l1s_temporarily_left_member_expires_after_session_timeout_and_its_shards_move():
    state, (a, b, c, d) = _static_group(session_timeout_ms=30_000)
    held = set(state.granted_to("m0"))
    a.send(at(10), member_epoch=-2)
    for t in (20, 30, 39):
        settle([b, c, d], at(t))
    assert engine.l1_expire_silent_members(state, at(39.5)) == []
    epoch = state.group_epoch
    assert engine.l1_expire_silent_members(state, at(40.5)) == ["m0"]
    assert state.members["m0"].status == MemberStatus.EXPIRED
    assert state.group_epoch == epoch + 1
    assert state.held_by("m0") == set()
    assert state.target_of("m0") == set()
    settle([b, c, d], at(41))
    assert held <= state.granted_to("m1") | state.granted_to("m2") | state.granted_to("m3")
    late = Client(state, "m0-late", instance_id="inst-0").join(at(42))
    assert late.error_code == "NONE"
    assert state.group_epoch == epoch + 2


static_ops = st.lists(
    st.tuples(st.sampled_from(["leave_temporarily", "rejoin", "replace", "join", "leave"]),
              st.integers(0, 7)),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 6), st.integers(1, 16), static_ops, st.integers(0, 7))
def test_r1s_a_replacement_never_changes_another_members_target(members, shards, ops, victim):
    """Any history of temporary leaves, rejoins, replacements, joins and leaves, then one more
    replacement: the new member's target is exactly the old one's, nobody else's changes,
    and no shard is held twice (R9)."""
    state, clients = group_with([f"m{i}" for i in range(members)], shards,
                                instance_ids=[f"inst-{i}" for i in range(members)])
    fresh = iter(range(1000))
    away: dict[str, set[str]] = {}  # temporarily left member -> its target when it left
    for op, i in ops:
        cl = clients[i % len(clients)]
        away.pop(cl.member_id, None)
        if op == "leave_temporarily":
            cl.send(member_epoch=-2)
            away[cl.member_id] = set(state.target_of(cl.member_id))
        elif op == "rejoin":
            cl.join()
        elif op == "replace":
            clients[i % len(clients)] = Client(state, f"r{next(fresh)}", instance_id=cl.instance_id)
            clients[i % len(clients)].join()
        elif op == "join":
            clients.append(Client(state, f"n{next(fresh)}", instance_id=f"inst-n{next(fresh)}"))
            clients[-1].join()
        elif op == "leave" and len(clients) > 1:
            cl.send(member_epoch=-1)
            clients.remove(cl)
        for other in clients:
            live = state.members[other.member_id].status in (
                MemberStatus.STABLE, MemberStatus.PENDING, MemberStatus.REVOKING
            )
            if live and other.beat().assignment.revoking:
                other.revoke_all()
        assert engine.owners_are_exclusive(state)
        for mid, target in away.items():  # R2s: reserved as it was, whatever else happened
            assert state.members[mid].temporarily_left
            assert state.target_of(mid) == target
    old = clients[victim % len(clients)]
    before = _targets(state)
    r = Client(state, "replacement", instance_id=old.instance_id).join()
    assert r.error_code == "NONE"
    assert _targets(state) == {
        s: ("replacement" if t == old.member_id else t) for s, t in before.items()
    }
    assert engine.owners_are_exclusive(state)
    assert len([m for m in state.live_members() if m.instance_id == old.instance_id]) == 1
