"""GET /api/v1/groups/{group} (describe, §10)."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from coordination.liveness import Liveness
from coordination.model import LIVE_STATUSES, GroupPhase, MemberStatus, ShardState
from dataplane.protocol import ErrorCode
from groups.access import authorize_group
from groups.api_errors import error_body
from groups.describe import describe_group

_shard_list = serializers.ListField(child=serializers.CharField())
_member = inline_serializer("DescribedMember", {
    "memberId": serializers.CharField(),
    "instanceId": serializers.CharField(allow_null=True, help_text="static membership (§9); null for dynamic members"),
    "clientId": serializers.CharField(),
    "memberEpoch": serializers.IntegerField(),
    "state": serializers.ChoiceField(choices=[s.value for s in MemberStatus if s in LIVE_STATUSES]),
    "liveness": serializers.ChoiceField(
        choices=[x.value for x in Liveness],
        help_text="late: silent for more than 2 heartbeat intervals; expired: beyond the session timeout",
    ),
    "assignedShards": _shard_list,
    "pendingShards": _shard_list,
    "revokingShards": _shard_list,
    "targetShards": _shard_list,
    "lastHeartbeatAt": serializers.DateTimeField(allow_null=True),
    "sinceLastHeartbeatMs": serializers.IntegerField(allow_null=True, help_text="null: never heartbeated"),
    "expiresInS": serializers.IntegerField(allow_null=True, help_text="TEMPORARILY_LEFT: seconds until L1s"),
})
_shard = inline_serializer("DescribedShard", {
    "shardId": serializers.CharField(),
    "version": serializers.IntegerField(),
    "state": serializers.ChoiceField(choices=[s.value for s in ShardState]),
    "sealed": serializers.BooleanField(),
    "owner": serializers.CharField(allow_null=True, help_text="memberId of the owner"),
    "clientId": serializers.CharField(allow_null=True, help_text="the owner's clientId"),
    "instanceId": serializers.CharField(allow_null=True, help_text="the owner's instanceId (§9)"),
    "lag": serializers.IntegerField(
        allow_null=True, help_text="entries not yet delivered to the group; null when Redis could not be read"),
    "lagExact": serializers.BooleanField(help_text="false: lag is a lower bound (null-lag fallback hit its limit)"),
    "pending": serializers.IntegerField(allow_null=True, help_text="delivered, not ACKed"),
    "lastDeliveredId": serializers.CharField(allow_null=True),
    "entriesRead": serializers.IntegerField(allow_null=True),
    "dlqLength": serializers.IntegerField(allow_null=True),
})
_described = inline_serializer("DescribedGroup", {
    "group": serializers.CharField(),
    "stream": serializers.CharField(),
    "state": serializers.ChoiceField(choices=[p.value for p in GroupPhase]),
    "streamState": serializers.CharField(),
    "groupEpoch": serializers.IntegerField(),
    "assignmentEpoch": serializers.IntegerField(),
    "metadataEpoch": serializers.IntegerField(),
    "members": serializers.ListField(child=_member),
    "shards": serializers.ListField(child=_shard),
    "totals": inline_serializer("DescribedTotals", {
        "lag": serializers.IntegerField(allow_null=True),
        "pending": serializers.IntegerField(allow_null=True),
        "dlq": serializers.IntegerField(allow_null=True),
    }),
    "redis": inline_serializer("ShardStatsSource", {
        "ok": serializers.BooleanField(),
        "error": serializers.CharField(allow_null=True),
        "asOf": serializers.DateTimeField(help_text="when the figures were read (cached ≤ 2 s)"),
    }),
})


class DescribeGroupView(APIView):
    @extend_schema(
        responses={200: _described},
        summary="Describe a group: epochs, members, shards with lag, pending and DLQ length",
    )
    def get(self, request: Request, group: str) -> Response:
        refused = authorize_group(request, group)
        if refused is not None:
            return refused
        doc = describe_group(group)
        if doc is None:
            return Response(error_body(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group!r} does not exist"), 404)
        return Response(doc)
