"""One home for the protocol's names (issue 9.3): the coordinator's validator and the member's
request builder both speak exactly `dataplane.protocol.REQUEST_FIELDS`; codes and states come
from the same module. (Hash and shard math: dataplane/test_routing.py, the golden vectors.)"""
from __future__ import annotations

from typing import Any

import pytest

from coordination.wire import InvalidRequest, parse_heartbeat
from dataplane.heartbeat import heartbeat_request
from dataplane.protocol import (
    FENCING_ERRORS,
    HTTP_STATUS,
    INSTANCE_REPLACED_MARKER,
    JOIN_EPOCH,
    LEAVE_EPOCH,
    REQUEST_FIELDS,
    TEMPORARY_LEAVE_EPOCH,
    ErrorCode,
    InstanceReplaced,
    RevokeState,
    answer_body,
    instance_replaced,
    instance_replaced_answer,
    instance_replaced_reason,
)
from dataplane.routing import parse_shard_id, shard_id, shard_sort_key


class _ReadRecorder(dict[str, Any]):
    """A request body that remembers which fields the validator looked at."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)


def test_validator_reads_exactly_the_protocol_request_fields():
    body = _ReadRecorder({"memberId": "m1", "memberEpoch": 3, "revokingShards": [{"shard": "s:1:0", "state": "REVOKED"}]})
    parse_heartbeat(body)
    assert body.read == set(REQUEST_FIELDS)


@pytest.mark.parametrize("epoch", [JOIN_EPOCH, 4, LEAVE_EPOCH, TEMPORARY_LEAVE_EPOCH])
def test_member_request_uses_only_protocol_fields_and_the_validator_accepts_it(epoch: int):
    req = heartbeat_request("m1", epoch, 2, ["s:1:0"], {"s:1:1": RevokeState.REVOKING}, ["s:1:0"],
                            client_id="host/pid-1", instance_id="i-1", rebalance_timeout_ms=30_000)
    assert set(req) <= set(REQUEST_FIELDS)
    parsed = parse_heartbeat(req)  # the coordinator's validator takes what the member sends
    assert parsed.member_epoch == epoch
    assert parsed.instance_id == "i-1"
    if epoch > 0:
        assert set(req) == set(REQUEST_FIELDS) - {"rebalanceTimeoutMs"}
        assert [(r.shard, r.state) for r in parsed.revoking_shards] == [("s:1:1", RevokeState.REVOKING)]


def test_validator_names_the_revoke_states_of_the_protocol():
    with pytest.raises(InvalidRequest, match=r"revokingShards\[0\]\.state: must be one of REVOKING, REVOKED$"):
        parse_heartbeat({"memberId": "m1", "memberEpoch": 3, "revokingShards": [{"shard": "s:1:0", "state": "GONE"}]})


def test_fencing_errors_are_the_409_answers_other_than_a_full_group():
    conflicts = {code for code, status in HTTP_STATUS.items() if status == 409}
    assert conflicts - {ErrorCode.GROUP_MAX_SIZE_REACHED} == FENCING_ERRORS


@pytest.mark.parametrize("decoded", [None, [1, 2], "text", 5])
def test_an_answer_that_is_no_json_object_is_an_invalid_response(decoded: Any):
    body = answer_body(decoded, "x" * 500)
    assert body == {"errorCode": "INVALID_RESPONSE", "errorMessage": "x" * 200}
    assert answer_body({"errorCode": "NONE"}, "") == {"errorCode": "NONE"}


def test_shard_ids_round_trip_and_sort_naturally():
    ids = [shard_id("my:stream", v, i) for v in (2, 10) for i in (10, 9, 1)]
    assert [parse_shard_id(s) for s in ids[:1]] == [("my:stream", 2, 10)]
    assert sorted(ids, key=shard_sort_key) == [
        "my:stream:2:1", "my:stream:2:9", "my:stream:2:10", "my:stream:10:1", "my:stream:10:9", "my:stream:10:10",
    ]


# ---- the R1s marker (§9): "replaced by a newer incarnation of your instanceId" ---------------


def test_r1s_replaced_reason_starts_with_the_marker_and_names_instance_and_new_member():
    reason = instance_replaced_reason("billing-3", "host-7-881-a1b2c3")
    assert reason.startswith(INSTANCE_REPLACED_MARKER)
    assert instance_replaced(reason) == InstanceReplaced("billing-3", "host-7-881-a1b2c3")
    body = {"errorCode": "UNKNOWN_MEMBER_ID", "errorMessage": f"{reason}; stop", "memberId": "m"}
    assert instance_replaced_answer(body) == InstanceReplaced("billing-3", "host-7-881-a1b2c3")


def test_r1s_marker_reworded_after_it_still_means_replaced_without_details():
    body = {"errorCode": "UNKNOWN_MEMBER_ID", "errorMessage": f"{INSTANCE_REPLACED_MARKER}: gone"}
    assert instance_replaced_answer(body) == InstanceReplaced(None, None)


@pytest.mark.parametrize("body", [
    {"errorCode": "UNKNOWN_MEMBER_ID", "errorMessage": "member 'm' is not in the group (expired); rejoin"},
    {"errorCode": "UNKNOWN_MEMBER_ID", "errorMessage": "member 'm' is not in the group (left: removed by operator)"},
    {"errorCode": "UNKNOWN_MEMBER_ID", "errorMessage": None},
    {"errorCode": "UNKNOWN_MEMBER_ID"},
    {"errorCode": "UNKNOWN_MEMBER_ID", "errorMessage": 7},
    # Only UNKNOWN_MEMBER_ID carries it (§9); the marker anywhere but first does not count.
    {"errorCode": "FENCED_MEMBER_EPOCH", "errorMessage": instance_replaced_reason("i", "m")},
    {"errorCode": "UNKNOWN_MEMBER_ID", "errorMessage": "x " + instance_replaced_reason("i", "m")},
])
def test_r1s_marker_absent_means_not_replaced(body):
    assert instance_replaced_answer(body) is None
