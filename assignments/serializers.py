"""The heartbeat wire format (PROTOCOL.md §3) as OpenAPI sees it."""
from __future__ import annotations

from rest_framework import serializers

from coordination.model import MEMBER_ID_OPENAPI_PATTERN, RevokeState
from coordination.wire import (
    MAX_CLIENT_ID_LENGTH,
    MAX_EPOCH,
    MAX_SHARD_ID_LENGTH,
    MAX_SHARDS_PER_LIST,
    REBALANCE_TIMEOUT_MS_RANGE,
)


class RevokingShardSerializer(serializers.Serializer):
    shard = serializers.CharField(max_length=MAX_SHARD_ID_LENGTH)
    state = serializers.ChoiceField(choices=[s.value for s in RevokeState])


class HeartbeatRequestSerializer(serializers.Serializer):
    """OpenAPI description of the request; validation is coordination.wire.parse_heartbeat."""

    memberId = serializers.RegexField(MEMBER_ID_OPENAPI_PATTERN, max_length=64,
                                      help_text="1-64 chars of [A-Za-z0-9._:-], kept for the life of the process")
    memberEpoch = serializers.IntegerField(
        min_value=-2, max_value=MAX_EPOCH,
        help_text="0 joins/rejoins, -1 leaves, -2 leaves temporarily (members with an instanceId), >0 regular")
    instanceId = serializers.RegexField(
        MEMBER_ID_OPENAPI_PATTERN, max_length=64, required=False, allow_null=True,
        help_text="static membership (§9): a rejoin with the same instanceId gets the same shards back")
    clientId = serializers.CharField(required=False, max_length=MAX_CLIENT_ID_LENGTH,
                                     help_text="informational, e.g. host/pid")
    rebalanceTimeoutMs = serializers.IntegerField(
        required=False, allow_null=True, min_value=REBALANCE_TIMEOUT_MS_RANGE[0],
        max_value=REBALANCE_TIMEOUT_MS_RANGE[1], help_text="on join; default: the group's")
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
    """Documentation of an accepted heartbeat's response (200); every field is always present.

    Errors (4xx) are `groups.api_errors.ErrorBodySerializer`: errorCode (INVALID_REQUEST,
    GROUP_ID_NOT_FOUND, UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH, GROUP_MAX_SIZE_REACHED,
    AUTHENTICATION_FAILED, AUTHORIZATION_FAILED, RATE_LIMITED), errorMessage, memberId.
    """

    errorCode = serializers.ChoiceField(choices=["NONE"])
    errorMessage = serializers.CharField(allow_null=True)
    status = serializers.ChoiceField(choices=["OK", "SYNC_METADATA", "REVOKE_PENDING"])
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

    errorCode = serializers.CharField()
    errorMessage = serializers.CharField()
    memberId = serializers.CharField(required=False, help_text="present where the request named one")
