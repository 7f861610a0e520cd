"""The pure membership state machine against recorded coordinator transcripts (C1–C6)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dataplane.membership import Actions, Membership
from dataplane.protocol import InstanceReplaced, instance_replaced_reason

RECORDED = Path(__file__).parent / "recorded"


def replay(name: str) -> Membership:
    """Drive a fresh machine through a recorded transcript, checking every expectation."""
    fx = json.loads((RECORDED / f"{name}.json").read_text())
    m = Membership(fx["memberId"], instance_id=fx.get("instanceId"))
    for i, step in enumerate(fx["steps"]):
        where = f"{name} step {i} ({step['op']})"
        op = step["op"]
        actions: Actions | None = None
        if op == "poll":
            assert m.poll(step["now"]) == step["expectRequest"], where
        elif op == "respond":
            actions = m.on_response(step["now"], step["http"], step["body"])
        elif op == "fail":
            actions = m.on_failure(step["now"])
        elif op == "finished":
            m.revocation_finished(step["shard"])
        elif op == "drained":
            m.shard_drained(step["shard"])
        elif op == "leave":
            actions = m.leave()
        else:  # pragma: no cover - fixture typo
            raise AssertionError(f"unknown op {op}")
        if "expectActions" in step:
            exp = step["expectActions"]
            assert actions is not None, where
            assert [g.shard for g in actions.grant] == exp["grant"], where
            assert actions.revoke == exp["revoke"], where
            assert actions.abort == exp["abort"], where
            assert actions.rejoin == exp.get("rejoin", False), where
            assert actions.left == exp.get("left", False), where
        if "expectReadable" in step:
            assert sorted(m.readable) == step["expectReadable"], where
        if "expectGrantEpochs" in step:
            got = {s: g.grant_epoch for s, g in m.readable.items()}
            assert got == step["expectGrantEpochs"], where
    return m


def test_recorded_fixtures_are_all_exercised() -> None:
    names = {p.stem for p in RECORDED.glob("*.json")}
    tested = {
        "c1_revoke_after_inflight_zero",
        "c2_ok_grants",
        "c3_sync_metadata_is_drain_only",
        "c3_revoke_pending_is_drain_only",
        "c4_fenced",
        "c4_epoch_mismatch",
        "c5_unknown_member",
        "c6_reports_only_granted_and_duplicate_revoked",
        "leave",
        "drained_reported_while_owned",
        "r1s_replaced_instance_stops",
    }
    assert names == tested


def test_c1_revoked_shard_stops_and_is_reported_revoked_once_in_flight_is_zero() -> None:
    m = replay("c1_revoke_after_inflight_zero")
    assert m.revoking == {}
    assert sorted(m.owned) == ["orders:3:0"]


def test_c2_ok_adds_new_assigned_shards_with_grant_epoch_and_token() -> None:
    m = replay("c2_ok_grants")
    g = m.readable["orders:3:2"]
    assert g.token == "6:m-1"
    assert g.redis_key == "rsc:{orders:3:2}"
    assert g.seal_key == "rsc:{orders:3:2}:sealed"
    assert g.start_id == "0"


def test_c3_sync_metadata_is_drain_only_and_updates_metadata_epoch() -> None:
    m = replay("c3_sync_metadata_is_drain_only")
    assert m.metadata_epoch == 10
    assert m.metadata is not None
    assert len(m.metadata["versions"]) == 2


def test_c3_revoke_pending_does_not_grant_new_shards() -> None:
    replay("c3_revoke_pending_is_drain_only")


def test_c4_fenced_clears_ownership_and_rejoins_with_epoch_0() -> None:
    m = replay("c4_fenced")
    assert m.member_id == "m-1"
    assert m.revoking == {}
    assert m.drained == set()


def test_c4_epoch_mismatch_is_treated_as_fenced() -> None:
    replay("c4_epoch_mismatch")


def test_c4_member_id_mismatch_is_treated_as_fenced() -> None:
    m = Membership("m-1")
    m.poll(0)
    body = _ok(5, ["s:1:0"], member="someone-else")
    actions = m.on_response(1, 200, body)
    assert actions.rejoin
    assert m.readable == {}
    assert m.member_epoch == 0


def test_c5_unknown_member_rejoins_with_empty_ownership() -> None:
    m = replay("c5_unknown_member")
    assert sorted(m.readable) == ["orders:3:1"]


def test_c6_only_granted_shards_reported_and_revoked_duplicates_resent() -> None:
    replay("c6_reports_only_granted_and_duplicate_revoked")


def test_leave_revokes_everything_then_sends_epoch_minus_1() -> None:
    m = replay("leave")
    assert m.left


def test_drained_shards_reported_while_owned() -> None:
    replay("drained_reported_while_owned")


# ---- properties not tied to one transcript -----------------------------------------------


def _ok(epoch: int, assigned: list[str], member: str = "m-1", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "errorCode": "NONE",
        "errorMessage": None,
        "status": "OK",
        "memberId": member,
        "memberEpoch": epoch,
        "assignmentEpoch": epoch,
        "heartbeatIntervalMs": 1000,
        "assignment": {"assignedShards": assigned, "pendingShards": [], "revokingShards": []},
        "metadata": {"metadataEpoch": 1},
    }
    body.update(extra)
    return body


def _metadata(start: str, form: str = "versions") -> dict[str, Any]:
    """§3 metadata in its form ("versions": each version's shape) or the first form ("shards":
    every shard listed), which a member still reads."""

    def shard(v: int, i: int, parents: list[str]) -> dict[str, Any]:
        sid = f"s:{v}:{i}"
        return {
            "shardId": sid,
            "index": i,
            "redisKey": f"p:{{{sid}}}",
            "sealKey": f"p:{{{sid}}}:sealed",
            "parents": parents,
        }

    if form == "shards":
        versions: list[dict[str, Any]] = [
            {"version": 1, "state": "SEALED", "shardCount": 1, "shards": [shard(1, 0, [])]},
            {
                "version": 2,
                "state": "ACTIVE",
                "shardCount": 2,
                "shards": [shard(2, 0, ["s:1:0"]), shard(2, 1, ["s:1:0"])],
            },
        ]
    else:
        versions = [
            {"stream": "s", "version": 1, "state": "SEALED", "shardCount": 1,
             "parentVersion": None, "parentShardCount": None, "keyPrefix": "p"},
            {"stream": "s", "version": 2, "state": "ACTIVE", "shardCount": 2,
             "parentVersion": 1, "parentShardCount": 1, "keyPrefix": "p"},
        ]  # fmt: skip
    return {
        "metadataEpoch": 3,
        "group": "g",
        "stream": "s",
        "heartbeatIntervalMs": 1000,
        "sessionTimeoutMs": 5000,
        "startPosition": start,
        "keyPrefix": "p",
        "versions": versions,
    }


@pytest.mark.parametrize("form", ["versions", "shards"])
@pytest.mark.parametrize(("start", "first_version_start"), [("latest", "$"), ("earliest", "0")])
def test_grant_start_position_first_version_vs_child(
    start: str, first_version_start: str, form: str
) -> None:
    m = Membership("m-1")
    m.poll(0)
    m.on_response(1, 200, _ok(2, ["s:1:0", "s:2:1"], metadata=_metadata(start, form)))
    assert m.readable["s:1:0"].start_id == first_version_start
    assert m.readable["s:2:1"].start_id == "0"  # a child version starts from its beginning
    assert m.readable["s:2:1"].redis_key == "p:{s:2:1}"
    assert m.readable["s:2:1"].seal_key == "p:{s:2:1}:sealed"
    assert m.session_timeout_ms == 5000
    assert m.heartbeat_interval_ms == 1000


def test_one_heartbeat_in_flight() -> None:
    m = Membership("m-1")
    assert m.poll(0) is not None
    for t in (1, 10_000, 100_000):
        assert m.poll(t) is None
    m.on_failure(100_001)
    assert m.poll(100_001) is None  # backoff
    assert m.poll(100_001 + 200) is not None


def test_session_timeout_without_accepted_heartbeat_stops_everything() -> None:
    m = Membership("m-1")
    m.poll(0)
    m.on_response(1, 200, _ok(3, ["s:1:0"]))
    assert not m.check_session(1 + m.session_timeout_ms)
    req = m.poll(1001)
    assert req is not None
    assert req["memberEpoch"] == 3
    m.on_failure(1001)
    actions = m.check_session(2 + m.session_timeout_ms)
    assert actions.abort == ["s:1:0"]
    assert not actions.rejoin  # it asks first (issue 27.11)
    assert m.readable == {}
    ask = m.poll(10**9)
    assert ask is not None
    assert ask["memberEpoch"] == 3
    assert ask["ownedShards"] == []


def _dynamic_after_a_lapse() -> Membership:
    """A member (no instance id) at epoch 3 holding two shards whose coordinator stayed silent
    past the session timeout, and that has aborted both."""
    m = Membership("m-1")
    m.poll(0)
    m.on_response(1, 200, _ok(3, ["s:1:0", "s:1:1"]))
    m.poll(1001)
    m.on_failure(1002)
    lapsed = m.check_session(2 + m.session_timeout_ms)
    assert lapsed.abort == ["s:1:0", "s:1:1"]
    assert not lapsed.rejoin
    return m


def test_i27_11_member_whose_session_lapsed_resumes_its_assignment_when_still_a_member() -> None:
    """The coordinator was down, not the member: it expired nobody. The member asks at its
    epoch holding nothing, and the OK answer gives its shards back: no epoch-0 rejoin."""
    m = _dynamic_after_a_lapse()
    t = 2 + m.session_timeout_ms
    ask = m.poll(t + 10_000)
    assert ask is not None
    assert (ask["memberEpoch"], ask["ownedShards"], ask["revokingShards"]) == (3, [], [])
    m.on_failure(t + 10_001)  # still down: it keeps asking at its epoch, no session check
    assert m.check_session(t + 10**6) == Actions()
    again = m.poll(t + 10**6)
    assert again is not None
    assert again["memberEpoch"] == 3
    actions = m.on_response(t + 10**6 + 1, 200, _ok(3, ["s:1:0", "s:1:1"]))
    assert not actions.rejoin
    assert [(g.shard, g.grant_epoch) for g in actions.grant] == [("s:1:0", 3), ("s:1:1", 3)]
    assert sorted(m.readable) == ["s:1:0", "s:1:1"]
    assert m.member_epoch == 3
    nxt = m.poll(t + 10**6 + 1001)
    assert nxt is not None
    assert nxt["memberEpoch"] == 3
    assert sorted(nxt["ownedShards"]) == ["s:1:0", "s:1:1"]


@pytest.mark.parametrize("body", [
    {"errorCode": "UNKNOWN_MEMBER_ID", "errorMessage": "expired", "memberId": "m-1"},
    {"errorCode": "FENCED_MEMBER_EPOCH", "errorMessage": "stale", "memberId": "m-1"},
])
def test_i27_11_member_whose_session_lapsed_rejoins_when_the_coordinator_expired_it(
    body: dict[str, Any],
) -> None:
    m = _dynamic_after_a_lapse()
    m.poll(10**6)
    actions = m.on_response(10**6 + 1, 409, body)
    assert actions.rejoin
    assert m.replaced is None
    join = m.poll(10**6 + 2)
    assert join is not None
    assert join["memberEpoch"] == 0


def test_i27_11_member_fenced_by_its_token_still_rejoins_without_asking() -> None:
    """A taken fence token is a loss the coordinator decided: no ask for a dynamic member."""
    m = Membership("m-1")
    m.poll(0)
    m.on_response(1, 200, _ok(3, ["s:1:0"]))
    actions = m.fence_locally(2, {"s:1:0"}, "fence token taken")
    assert actions.rejoin
    assert m.poll(3)["memberEpoch"] == 0


def test_other_errors_keep_ownership_and_back_off() -> None:
    m = Membership("m-1")
    m.poll(0)
    m.on_response(1, 200, _ok(3, ["s:1:0"]))
    m.poll(2000)
    actions = m.on_response(2001, 400, {"errorCode": "INVALID_REQUEST", "errorMessage": "x"})
    assert not actions
    assert sorted(m.readable) == ["s:1:0"]
    assert m.poll(2002) is None
    assert m.poll(2001 + 200)["memberEpoch"] == 3


def test_repeated_fencing_of_joins_backs_off() -> None:
    m = Membership("m-1")
    fenced = {"errorCode": "FENCED_MEMBER_EPOCH", "errorMessage": "x"}
    m.poll(0)
    m.on_response(1, 409, fenced)
    assert m.poll(1) is not None  # first fence: rejoin at once
    m.on_response(2, 409, fenced)
    assert m.poll(2) is None  # second in a row: back off
    assert m.poll(2 + 200) is not None


def test_leave_before_joining_sends_nothing() -> None:
    m = Membership("m-1")
    m.leave()
    assert m.poll(0) is None
    assert m.left


def test_regranted_while_revoking_cancels_revocation() -> None:
    m = Membership("m-1")
    m.poll(0)
    m.on_response(1, 200, _ok(3, ["s:1:0"]))
    m.poll(2000)
    a = m.on_response(2001, 200, _ok(3, [], status="REVOKE_PENDING"))
    assert a.revoke == ["s:1:0"]
    m.poll(4000)
    a = m.on_response(4001, 200, _ok(4, ["s:1:0"]))
    assert [g.shard for g in a.grant] == ["s:1:0"]
    assert m.revoking == {}
    assert m.readable["s:1:0"].grant_epoch == 4


def test_c4_refused_ack_right_after_the_session_check_does_not_fence_twice() -> None:
    m = Membership("m-1")
    m.poll(0)
    m.on_response(1, 200, _ok(3, ["s:1:0"]))
    m.poll(1001)
    m.on_failure(1001)  # the coordinator stays silent past the session timeout
    fenced = m.check_session(2 + m.session_timeout_ms)
    assert fenced.abort == ["s:1:0"]
    # Then the ACK of a message handled meanwhile is refused: the shard is already aborted.
    again = m.fence_locally(3 + m.session_timeout_ms, {"s:1:0"}, "fence token taken")
    assert not again
    req = m.poll(10**9)  # asks at its epoch: no second fence turned it into a rejoin
    assert req is not None
    assert req["memberEpoch"] == 3


def test_c4_fence_locally_on_a_held_shard_fences() -> None:
    m = Membership("m-1")
    m.poll(0)
    m.on_response(1, 200, _ok(3, ["s:1:0", "s:1:1"]))
    actions = m.fence_locally(2, {"s:1:1"}, "fence token taken")
    assert actions.abort == ["s:1:0", "s:1:1"]
    assert actions.rejoin
    assert m.member_epoch == 0
def test_static_member_sends_its_instance_id_and_leaves_with_minus_2_after_in_flight_work() -> None:
    """§9: instanceId on the join and every heartbeat; stopping drains (C1) then sends -2."""
    m = Membership("m-1", instance_id="billing-3")
    join = m.poll(0)
    assert join is not None
    assert join["memberEpoch"] == 0
    assert join["instanceId"] == "billing-3"
    m.on_response(1, 200, _ok(3, ["s:1:0"]))
    beat = m.poll(1001)
    assert beat is not None
    assert beat["memberEpoch"] == 3
    assert beat["instanceId"] == "billing-3"
    m.on_response(1002, 200, _ok(3, ["s:1:0"]))
    assert m.leave().revoke == ["s:1:0"]
    assert m.poll(1003) is None  # in-flight work on s:1:0 first
    m.revocation_finished("s:1:0")
    leave = m.poll(1004)
    assert leave is not None
    assert leave["memberEpoch"] == -2
    assert leave["instanceId"] == "billing-3"
    assert leave["ownedShards"] == []
    assert leave["revokingShards"] == []
    assert m.on_response(1005, 200, _ok(-2, [])).left
    assert m.left


def test_member_without_instance_id_sends_none_and_leaves_with_minus_1() -> None:
    m = Membership("m-1")
    assert "instanceId" not in m.poll(0)
    m.on_response(1, 200, _ok(3, []))
    m.leave()
    assert m.poll(2) == {"memberId": "m-1", "memberEpoch": -1, "metadataEpoch": 1,
                         "ownedShards": [], "revokingShards": [], "drainedShards": []}


# ---- R1s (§9): replaced by a newer incarnation of the instanceId --------------------------


def _replaced_body(member: str = "m-1", by: str = "m-2", instance: str = "i-3") -> dict[str, Any]:
    message = (f"{instance_replaced_reason(instance, by)}; member {member!r} must stop, not rejoin:"
               " a newer process holds its instanceId (§9)")
    return {"errorCode": "UNKNOWN_MEMBER_ID", "errorMessage": message, "memberId": member}


def test_r1s_replaced_static_member_aborts_its_shards_and_stops_instead_of_rejoining() -> None:
    m = replay("r1s_replaced_instance_stops")
    assert m.left
    assert m.member_epoch == 0
    assert m.owned == {}
    assert m.revoking == {}
    assert m.replaced == InstanceReplaced("billing-3", "m-2")
    assert m.check_session(10**9) == Actions()  # nothing held, nothing to fence again


def test_r1s_replaced_static_member_aborts_revoking_shards_too() -> None:
    """C4: nothing it holds may be acked, shards still being revoked included."""
    m = Membership("m-1", instance_id="billing-3")
    m.poll(0)
    m.on_response(1, 200, _ok(3, ["s:1:0", "s:1:1"]))
    m.poll(3001)
    m.on_response(3002, 200, _ok(3, ["s:1:0"]))  # s:1:1 revoking, in flight
    assert m.revoking_in_progress == ["s:1:1"]
    m.poll(6002)
    actions = m.on_response(6003, 409, _replaced_body())
    assert actions.abort == ["s:1:0", "s:1:1"]
    assert actions.left
    assert not actions.rejoin
    assert m.poll(6004) is None
    assert m.poll(60_000) is None


def test_r1s_marker_without_instance_id_keeps_the_c5_rejoin() -> None:
    """Only a member with an instanceId can have been replaced by R1s: any other rejoins."""
    m = Membership("m-1")
    m.poll(0)
    m.on_response(1, 200, _ok(3, ["s:1:0"]))
    m.poll(3001)
    actions = m.on_response(3002, 409, _replaced_body())
    assert actions.rejoin
    assert not actions.left
    assert m.replaced is None
    assert (m.poll(3003) or {}).get("memberEpoch") == 0


@pytest.mark.parametrize("message", [
    "member 'm-1' is not in the group (expired); rejoin with memberEpoch 0",
    "member 'm-1' is not in the group (left: removed by operator); rejoin with memberEpoch 0",
    "member 'm-1' is not in the group (never joined); rejoin with memberEpoch 0",
    None,
])
def test_c5_static_member_unknown_without_the_r1s_marker_rejoins(message: str | None) -> None:
    m = Membership("m-1", instance_id="billing-3")
    m.poll(0)
    m.on_response(1, 200, _ok(3, ["s:1:0"]))
    m.poll(3001)
    body = {"errorCode": "UNKNOWN_MEMBER_ID", "errorMessage": message, "memberId": "m-1"}
    actions = m.on_response(3002, 409, body)
    assert actions.rejoin
    assert actions.abort == ["s:1:0"]
    assert not m.left
    assert m.replaced is None
    join = m.poll(3003)
    assert join is not None
    assert join["memberEpoch"] == 0
    assert join["instanceId"] == "billing-3"


def test_r1s_replaced_while_leaving_just_leaves() -> None:
    """Stopping anyway (SIGTERM): being replaced meanwhile is no failure of this process."""
    m = Membership("m-1", instance_id="billing-3")
    m.poll(0)
    m.on_response(1, 200, _ok(3, ["s:1:0"]))
    m.leave()
    assert m.poll(1001) is not None  # in-flight work on s:1:0: a regular heartbeat (REVOKING)
    actions = m.on_response(3, 409, _replaced_body())
    assert actions.left
    assert m.left
    assert m.replaced is None


def _static_holding(*shards: str) -> Membership:
    m = Membership("m-1", instance_id="i-3")
    m.poll(0)
    m.on_response(1, 200, _ok(3, list(shards)))
    return m


def test_r1s_static_member_fenced_by_its_token_asks_first_and_stops_if_replaced() -> None:
    """Its join would replace whoever holds the instanceId now, maybe the newer process whose
    grants took the token: it asks at its epoch, holding nothing, and learns it was replaced."""
    m = _static_holding("s:1:0", "s:1:1")
    actions = m.fence_locally(2, {"s:1:0"}, "fence token taken")
    assert actions.abort == ["s:1:0", "s:1:1"]
    assert not actions.rejoin
    assert not actions.left
    ask = m.poll(3)
    assert ask is not None
    assert ask["memberEpoch"] == 3
    assert ask["instanceId"] == "i-3"
    assert ask["ownedShards"] == []
    assert ask["revokingShards"] == []
    actions = m.on_response(4, 409, _replaced_body())
    assert actions.left
    assert actions.abort == []
    assert m.replaced == InstanceReplaced("i-3", "m-2")
    assert m.poll(5) is None


@pytest.mark.parametrize(("http", "body"), [
    (409, {"errorCode": "UNKNOWN_MEMBER_ID", "errorMessage": "expired", "memberId": "m-1"}),
    (409, {"errorCode": "FENCED_MEMBER_EPOCH", "errorMessage": "stale", "memberId": "m-1"}),
    (200, _ok(3, ["s:1:0", "s:1:1"])),  # still a member: its old grants' tokens may be past
])
def test_c5_static_member_that_asked_and_was_not_replaced_rejoins(http: int, body: dict) -> None:
    m = _static_holding("s:1:0", "s:1:1")
    m.fence_locally(2, {"s:1:0"}, "fence token taken")
    m.poll(3)
    actions = m.on_response(4, http, body)
    assert actions.rejoin
    assert actions.grant == []
    assert m.readable == {}
    assert m.replaced is None
    join = m.poll(5)
    assert join is not None
    assert join["memberEpoch"] == 0
    assert join["instanceId"] == "i-3"


def test_c5_static_member_asks_again_after_a_lost_or_refused_answer() -> None:
    m = _static_holding("s:1:0")
    m.fence_locally(2, {"s:1:0"}, "fence token taken")
    m.poll(3)
    m.on_failure(4)
    m.poll(10_000)
    m.on_response(10_001, 503, {"errorCode": "COORDINATOR_UNAVAILABLE", "errorMessage": "busy"})
    again = m.poll(20_000)
    assert again is not None
    assert again["memberEpoch"] == 3
    assert m.on_response(20_001, 409, _replaced_body()).left
    assert m.replaced is not None


def test_r1s_static_member_whose_session_lapsed_asks_before_rejoining() -> None:
    m = _static_holding("s:1:0")
    m.poll(1001)  # unanswered: the session check waits for it
    m.on_failure(1002)
    actions = m.check_session(40_000)
    assert actions.abort == ["s:1:0"]
    assert not actions.rejoin
    ask = m.poll(40_001)
    assert ask is not None
    assert ask["memberEpoch"] == 3
    assert ask["ownedShards"] == []


# ---- §11 group pause ---------------------------------------------------------------------------


def _answer(m: Membership, now: int, body: dict[str, Any]) -> Actions:
    req = m.poll(now)
    assert req is not None
    return m.on_response(now + 1, 200, body)


def test_s11_paused_keeps_ownership_reads_nothing_and_resumes() -> None:
    m = Membership("m-1")
    _answer(m, 0, _ok(2, ["s:1:0"]))
    assert sorted(m.readable) == ["s:1:0"]
    assert not m.paused
    actions = _answer(m, 2000, _ok(2, ["s:1:0"], status="PAUSED"))
    assert not actions  # nothing aborted or revoked: the shard stays ours
    assert m.paused
    assert m.readable == {}
    assert sorted(m.owned) == ["s:1:0"]
    req = m.poll(4000)
    assert req is not None
    assert req["ownedShards"] == ["s:1:0"]
    m.on_response(4001, 200, _ok(2, ["s:1:0"]))
    assert not m.paused
    assert sorted(m.readable) == ["s:1:0"]


def test_s11_a_shard_granted_while_paused_is_owned_but_not_readable() -> None:
    m = Membership("m-1")
    _answer(m, 0, _ok(2, ["s:1:0"], status="PAUSED"))
    assert sorted(m.owned) == ["s:1:0"]
    assert m.readable == {}
    actions = _answer(m, 2000, _ok(3, ["s:1:0", "s:1:1"], status="PAUSED"))
    assert [g.shard for g in actions.grant] == ["s:1:1"]  # set up (fence, group), not read
    assert m.readable == {}
    _answer(m, 4000, _ok(3, ["s:1:0", "s:1:1"]))
    assert sorted(m.readable) == ["s:1:0", "s:1:1"]


def test_s11_a_shard_revoked_while_paused_is_reported_revoked_when_in_flight_is_zero() -> None:
    m = Membership("m-1")
    _answer(m, 0, _ok(2, ["s:1:0", "s:1:1"]))
    actions = _answer(m, 2000, _ok(3, ["s:1:0"], status="PAUSED", assignment={
        "assignedShards": ["s:1:0"], "pendingShards": [], "revokingShards": ["s:1:1"]}))
    assert actions.revoke == ["s:1:1"]
    m.revocation_finished("s:1:1")
    req = m.poll(2002)  # urgent: reported at once
    assert req is not None
    assert req["revokingShards"] == [{"shard": "s:1:1", "state": "REVOKED"}]


def test_s11_an_unknown_status_is_drain_only() -> None:
    m = Membership("m-1")
    _answer(m, 0, _ok(2, ["s:1:0"]))
    actions = _answer(m, 2000, _ok(3, ["s:1:0", "s:1:1"], status="SOMETHING_NEW"))
    assert actions.grant == []  # nothing new is taken
    assert sorted(m.readable) == ["s:1:0"]
    assert not m.paused
