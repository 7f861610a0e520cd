"""The heartbeat wire format (PROTOCOL.md §3) as OpenAPI sees it."""
from __future__ import annotations

from rest_framework import serializers

from coordination.wire import (
    MAX_CLIENT_ID_LENGTH,
    MAX_EPOCH,
    MAX_SHARD_ID_LENGTH,
    MAX_SHARDS_PER_LIST,
    REBALANCE_TIMEOUT_MS_RANGE,
)
from dataplane.protocol import (
    MEMBER_ID_OPENAPI_PATTERN,
    MEMBER_ID_RULE,
    TEMPORARY_LEAVE_EPOCH,
    ErrorCode,
    RevokeState,
    Status,
)

# Every errorCode a coordinator sends in an error body (INVALID_RESPONSE is the member's own).
ERROR_CODES_SENT = tuple(c for c in ErrorCode if c not in (ErrorCode.NONE, ErrorCode.INVALID_RESPONSE))


class RevokingShardSerializer(serializers.Serializer):
    shard = serializers.CharField(max_length=MAX_SHARD_ID_LENGTH)
    state = serializers.ChoiceField(choices=[s.value for s in RevokeState])


class HeartbeatRequestSerializer(serializers.Serializer):
    """OpenAPI description of the request; validation is coordination.wire.parse_heartbeat."""

    memberId = serializers.RegexField(MEMBER_ID_OPENAPI_PATTERN, max_length=64,
                                      help_text=f"{MEMBER_ID_RULE}, kept for the life of the process")
    memberEpoch = serializers.IntegerField(
        min_value=TEMPORARY_LEAVE_EPOCH, max_value=MAX_EPOCH,
        help_text="0 joins/rejoins, -1 leaves, -2 leaves temporarily (members with an instanceId), >0 regular")
    instanceId = serializers.RegexField(
        MEMBER_ID_OPENAPI_PATTERN, max_length=64, required=False, allow_null=True,
        help_text="static membership (§9): a rejoin with the same instanceId gets the same shards back")
    clientId = serializers.CharField(required=False, max_length=MAX_CLIENT_ID_LENGTH,
                                     help_text="informational, e.g. host/pid")
    rebalanceTimeoutMs = serializers.IntegerField(
        required=False, allow_null=True, min_value=REBALANCE_TIMEOUT_MS_RANGE[0],
        max_value=REBALANCE_TIMEOUT_MS_RANGE[1],
        help_text="on join; may shorten the group's rebalance timeout, never lengthen it (capped at the group's); default: the group's")
    metadataEpoch = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_EPOCH,
                                             help_text="metadata the member holds; behind → SYNC_METADATA")
    ownedShards = serializers.ListField(
        child=serializers.CharField(max_length=MAX_SHARD_ID_LENGTH), required=False, allow_null=True,
        max_length=MAX_SHARDS_PER_LIST,
        help_text="full list of owned shards; [] on join; null = unchanged since the last accepted heartbeat",
    )
    revokingShards = serializers.ListField(child=RevokingShardSerializer(), required=False,
                                           max_length=MAX_SHARDS_PER_LIST)
    drainedShards = serializers.ListField(
        child=serializers.CharField(max_length=MAX_SHARD_ID_LENGTH), required=False,
        max_length=MAX_SHARDS_PER_LIST, help_text="sealed shards this member read to the end (§6)",
    )


class AssignmentSerializer(serializers.Serializer):
    assignedShards = serializers.ListField(child=serializers.CharField())
    pendingShards = serializers.ListField(child=serializers.CharField())
    revokingShards = serializers.ListField(child=serializers.CharField())


class HeartbeatResponseSerializer(serializers.Serializer):
    """Documentation of an accepted heartbeat's response (200); every field is always present
    (`dataplane.protocol.RESPONSE_FIELDS`). Errors (4xx/5xx) are `ErrorBodySerializer`."""

    errorCode = serializers.ChoiceField(choices=[ErrorCode.NONE.value])
    errorMessage = serializers.CharField(allow_null=True)
    status = serializers.ChoiceField(choices=[s.value for s in Status])
    memberId = serializers.CharField()
    memberEpoch = serializers.IntegerField()
    assignmentEpoch = serializers.IntegerField()
    heartbeatIntervalMs = serializers.IntegerField()
    assignment = AssignmentSerializer()
    metadata = serializers.DictField(
        help_text="{metadataEpoch} always; the full document (settings, versions, shards) on join and SYNC_METADATA",
    )


class ErrorBodySerializer(serializers.Serializer):
    """OpenAPI description of every error body (4xx/5xx, groups.api_errors.error_body)."""

    errorCode = serializers.ChoiceField(choices=[c.value for c in ERROR_CODES_SENT])
    errorMessage = serializers.CharField()
    memberId = serializers.CharField(required=False, help_text="present where the request named one")
