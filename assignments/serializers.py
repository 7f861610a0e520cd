"""The heartbeat wire format (PROTOCOL.md §3): strict validation and the OpenAPI description."""
from __future__ import annotations

from typing import Any

from rest_framework import serializers

from coordination.model import MEMBER_ID_RE, HeartbeatRequest, RevokeReport, RevokeState

MAX_SHARDS_PER_LIST = 10_000
MAX_EPOCH = 2**31 - 1


class StrictIntegerField(serializers.IntegerField):
    """Refuses "5", 5.0 and true: a wrong type is a client bug, not something to coerce."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class ShardIdField(StrictCharField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=240, allow_blank=False, **kwargs)


class RevokingShardSerializer(serializers.Serializer):
    shard = ShardIdField()
    state = serializers.ChoiceField(choices=[s.value for s in RevokeState])


class HeartbeatRequestSerializer(serializers.Serializer):
    memberId = StrictCharField(max_length=64, help_text="1-64 chars of [A-Za-z0-9._:-], kept for the life of the process")
    memberEpoch = StrictIntegerField(min_value=-1, max_value=MAX_EPOCH, help_text="0 joins/rejoins, -1 leaves, >0 regular")
    clientId = StrictCharField(required=False, allow_blank=True, max_length=200)
    rebalanceTimeoutMs = StrictIntegerField(required=False, allow_null=True, min_value=100, max_value=24 * 3600 * 1000)
    metadataEpoch = StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_EPOCH)
    ownedShards = serializers.ListField(
        child=ShardIdField(), required=False, allow_null=True, max_length=MAX_SHARDS_PER_LIST,
        help_text="full list of owned shards; [] on join; null = unchanged since the last accepted heartbeat",
    )
    revokingShards = serializers.ListField(
        child=RevokingShardSerializer(), required=False, max_length=MAX_SHARDS_PER_LIST
    )
    drainedShards = serializers.ListField(
        child=ShardIdField(), required=False, max_length=MAX_SHARDS_PER_LIST,
        help_text="sealed shards this member read to the end (§6)",
    )

    def validate_memberId(self, value: str) -> str:
        if not MEMBER_ID_RE.match(value):
            raise serializers.ValidationError("must be 1-64 characters of [A-Za-z0-9._:-]")
        return value

    def to_core(self) -> HeartbeatRequest:
        d = self.validated_data
        owned = d.get("ownedShards")
        return HeartbeatRequest(
            member_id=d["memberId"],
            member_epoch=d["memberEpoch"],
            metadata_epoch=d.get("metadataEpoch"),
            client_id=d.get("clientId", ""),
            rebalance_timeout_ms=d.get("rebalanceTimeoutMs"),
            owned_shards=tuple(dict.fromkeys(owned)) if owned is not None else None,
            revoking_shards=tuple(
                RevokeReport(r["shard"], RevokeState(r["state"])) for r in d.get("revokingShards", ())
            ),
            drained_shards=tuple(dict.fromkeys(d.get("drainedShards", ()))),
        )


class AssignmentSerializer(serializers.Serializer):
    assignedShards = serializers.ListField(child=serializers.CharField())
    pendingShards = serializers.ListField(child=serializers.CharField())
    revokingShards = serializers.ListField(child=serializers.CharField())


class HeartbeatResponseSerializer(serializers.Serializer):
    """Documentation of the response; every field is always present (null on errors)."""

    errorCode = serializers.ChoiceField(choices=[
        "NONE", "INVALID_REQUEST", "GROUP_ID_NOT_FOUND", "UNKNOWN_MEMBER_ID",
        "FENCED_MEMBER_EPOCH", "GROUP_MAX_SIZE_REACHED", "AUTHENTICATION_FAILED", "AUTHORIZATION_FAILED",
    ])
    errorMessage = serializers.CharField(allow_null=True)
    status = serializers.ChoiceField(choices=["OK", "SYNC_METADATA", "REVOKE_PENDING"], allow_null=True)
    memberId = serializers.CharField(allow_null=True)
    memberEpoch = serializers.IntegerField(allow_null=True)
    assignmentEpoch = serializers.IntegerField(allow_null=True)
    heartbeatIntervalMs = serializers.IntegerField(allow_null=True)
    assignment = AssignmentSerializer(allow_null=True)
    metadata = serializers.DictField(
        allow_null=True,
        help_text="{metadataEpoch} always; the full document (settings, versions, shards) on join and SYNC_METADATA",
    )
