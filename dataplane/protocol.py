"""The heartbeat protocol's words (PROTOCOL.md §2, §3): field names, ``errorCode`` and
``status`` values, revocation states, the memberId rule, the special ``memberEpoch`` values
and the marker of a member replaced by a newer incarnation of its instanceId (§9 R1s).

The one home of these names for both sides: the member library uses them, and the coordinator
(``coordination``, the Django apps) imports them from here; this module imports nothing but the
standard library. Hash and shard math and Redis key names are in ``routing``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# ---- memberEpoch (§3) -----------------------------------------------------------------------
JOIN_EPOCH = 0  # join or rejoin; ownedShards must be empty
LEAVE_EPOCH = -1  # leave: the member is removed and its shards released
TEMPORARY_LEAVE_EPOCH = -2  # static members (§9): shards and target stay reserved

# ---- memberId and instanceId (§2, §9) -------------------------------------------------------
# Checked with full matches (fullmatch and \Z): a pattern ending in `$` also accepts a trailing
# newline ("m1\n"). The ECMA form is for OpenAPI, whose `pattern` is a search.
MEMBER_ID_PATTERN = "[A-Za-z0-9._:-]{1,64}"
MEMBER_ID_RE = re.compile(rf"\A{MEMBER_ID_PATTERN}\Z")
MEMBER_ID_OPENAPI_PATTERN = f"^{MEMBER_ID_PATTERN}$"
MEMBER_ID_RULE = "1-64 characters of [A-Za-z0-9._:-]"  # for messages


# ---- field names (§3) -----------------------------------------------------------------------
REQUEST_FIELDS = (
    "memberId", "memberEpoch", "clientId", "instanceId", "rebalanceTimeoutMs", "metadataEpoch",
    "ownedShards", "revokingShards", "drainedShards",
)  # fmt: skip
# An accepted heartbeat carries every one of these; lists are full, never deltas.
RESPONSE_FIELDS = (
    "errorCode", "errorMessage", "status", "memberId", "memberEpoch", "assignmentEpoch",
    "heartbeatIntervalMs", "assignment", "metadata",
)  # fmt: skip
ASSIGNMENT_FIELDS = ("assignedShards", "pendingShards", "revokingShards")
# An error carries these only (memberId where the request named a valid one).
ERROR_FIELDS = ("errorCode", "errorMessage", "memberId")


class ErrorCode(StrEnum):
    NONE = "NONE"
    # The heartbeat's own answers (§3 table).
    INVALID_REQUEST = "INVALID_REQUEST"
    GROUP_ID_NOT_FOUND = "GROUP_ID_NOT_FOUND"
    UNKNOWN_MEMBER_ID = "UNKNOWN_MEMBER_ID"
    FENCED_MEMBER_EPOCH = "FENCED_MEMBER_EPOCH"
    GROUP_MAX_SIZE_REACHED = "GROUP_MAX_SIZE_REACHED"
    # The coordinator's HTTP layer, beyond §3 (docs/ARCHITECTURE.md "Decisions").
    AUTHENTICATION_FAILED = "AUTHENTICATION_FAILED"  # 401
    AUTHORIZATION_FAILED = "AUTHORIZATION_FAILED"  # 403
    RATE_LIMITED = "RATE_LIMITED"  # 429 with Retry-After
    COORDINATOR_UNAVAILABLE = "COORDINATOR_UNAVAILABLE"  # 503 with Retry-After
    INTERNAL_ERROR = "INTERNAL_ERROR"  # 500
    # The stream API (§6 routing document, reshard requests).
    STREAM_NOT_FOUND = "STREAM_NOT_FOUND"  # 404
    RESHARD_IN_PROGRESS = "RESHARD_IN_PROGRESS"  # 409: the stream is not STABLE
    # Never sent by a coordinator: the member's word for an answer that is no JSON object.
    INVALID_RESPONSE = "INVALID_RESPONSE"


# PROTOCOL.md §3 status table (the heartbeat core's answers).
HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.NONE: 200,
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.GROUP_ID_NOT_FOUND: 404,
    ErrorCode.UNKNOWN_MEMBER_ID: 409,
    ErrorCode.FENCED_MEMBER_EPOCH: 409,
    ErrorCode.GROUP_MAX_SIZE_REACHED: 409,
}

# C4: the answers that tell a member it no longer holds anything.
FENCING_ERRORS = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH})


class Status(StrEnum):
    OK = "OK"  # new grants allowed (C2)
    SYNC_METADATA = "SYNC_METADATA"  # drain-only until the member holds the current metadata
    REVOKE_PENDING = "REVOKE_PENDING"  # drain-only until the member reports REVOKED
    # §11: the operator paused the group: grants and revocations proceed, but the member reads
    # nothing (no XREADGROUP, no pending recovery) until an answer with another status.
    PAUSED = "PAUSED"


class RevokeState(StrEnum):
    """A ``revokingShards`` entry's state in a request."""

    REVOKING = "REVOKING"  # still finishing in-flight messages
    REVOKED = "REVOKED"  # in-flight reached 0 (C1)


# ---- R1s: replaced by a newer incarnation of the instanceId (§9) ------------------------------
# Kafka answers the old incarnation FENCED_INSTANCE_ID, a fatal error; §9 keeps the code
# UNKNOWN_MEMBER_ID and the error body has no other field, so the coordinator's errorMessage
# starts with this marker and a member with an instanceId stops instead of rejoining (C5), which
# would replace the newer process in turn, forever. Stable: members match it, do not reword it.
INSTANCE_REPLACED_MARKER = "INSTANCE_ID_REPLACED"
_INSTANCE_REPLACED_RE = re.compile(
    rf"\A{INSTANCE_REPLACED_MARKER}: replaced by member '(?P<by>{MEMBER_ID_PATTERN})'"
    rf" with instanceId '(?P<instance>{MEMBER_ID_PATTERN})'"
)


@dataclass(frozen=True, slots=True)
class InstanceReplaced:
    """Who took the place of a member replaced by R1s (None where the message does not say)."""

    instance_id: str | None
    by_member_id: str | None


def instance_replaced_reason(instance_id: str, by_member_id: str) -> str:
    """Why R1s removed a member: starts with the marker, names the instanceId and its new member."""
    return (
        f"{INSTANCE_REPLACED_MARKER}: replaced by member {by_member_id!r} with instanceId"
        f" {instance_id!r}"
    )


def instance_replaced(message: Any) -> InstanceReplaced | None:
    """The replacement a reason or errorMessage starting with the marker reports, else None."""
    if not isinstance(message, str) or not message.startswith(INSTANCE_REPLACED_MARKER):
        return None
    found = _INSTANCE_REPLACED_RE.match(message)
    if found is None:  # marked, worded differently: still replaced, details unknown
        return InstanceReplaced(None, None)
    return InstanceReplaced(found["instance"], found["by"])


def instance_replaced_answer(body: Mapping[str, Any]) -> InstanceReplaced | None:
    """An error body that says "a newer incarnation of your instanceId replaced you" (R1s):
    UNKNOWN_MEMBER_ID whose errorMessage starts with the marker."""
    if body.get("errorCode") != ErrorCode.UNKNOWN_MEMBER_ID:
        return None
    return instance_replaced(body.get("errorMessage"))


def answer_body(decoded: Any, text: str) -> dict[str, Any]:
    """A decoded answer as a body dict: one that is not a JSON object becomes an
    ``INVALID_RESPONSE`` error carrying the start of the text."""
    if isinstance(decoded, dict):
        return decoded
    return {"errorCode": ErrorCode.INVALID_RESPONSE.value, "errorMessage": text[:200]}


__all__ = [
    "ASSIGNMENT_FIELDS",
    "ERROR_FIELDS",
    "FENCING_ERRORS",
    "HTTP_STATUS",
    "INSTANCE_REPLACED_MARKER",
    "JOIN_EPOCH",
    "LEAVE_EPOCH",
    "MEMBER_ID_OPENAPI_PATTERN",
    "MEMBER_ID_PATTERN",
    "MEMBER_ID_RE",
    "MEMBER_ID_RULE",
    "REQUEST_FIELDS",
    "RESPONSE_FIELDS",
    "TEMPORARY_LEAVE_EPOCH",
    "ErrorCode",
    "InstanceReplaced",
    "RevokeState",
    "Status",
    "answer_body",
    "instance_replaced",
    "instance_replaced_answer",
    "instance_replaced_reason",
]
