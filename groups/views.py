"""GET /api/v1/groups/{group} (describe)."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from assignments import services
from assignments.views import authorize_group
from groups.api_errors import error_body

_member = inline_serializer("DescribedMember", {
    "memberId": serializers.CharField(),
    "clientId": serializers.CharField(),
    "memberEpoch": serializers.IntegerField(),
    "state": serializers.ChoiceField(choices=["STABLE", "REVOKING", "PENDING", "TEMPORARILY_LEFT"]),
    "assignedShards": serializers.ListField(child=serializers.CharField()),
    "pendingShards": serializers.ListField(child=serializers.CharField()),
    "revokingShards": serializers.ListField(child=serializers.CharField()),
    "targetShards": serializers.ListField(child=serializers.CharField()),
    "lastHeartbeatAt": serializers.DateTimeField(allow_null=True),
    "instanceId": serializers.CharField(allow_null=True),
    "expiresInS": serializers.IntegerField(allow_null=True, help_text="TEMPORARILY_LEFT: seconds until L1s"),
})
_described = inline_serializer("DescribedGroup", {
    "group": serializers.CharField(),
    "stream": serializers.CharField(),
    "state": serializers.ChoiceField(choices=["EMPTY", "ASSIGNING", "RECONCILING", "STABLE"]),
    "streamState": serializers.CharField(),
    "groupEpoch": serializers.IntegerField(),
    "assignmentEpoch": serializers.IntegerField(),
    "metadataEpoch": serializers.IntegerField(),
    "members": _member,
})


class DescribeGroupView(APIView):
    @extend_schema(responses={200: _described}, summary="Describe a group: epochs, members, assignments")
    def get(self, request: Request, group: str) -> Response:
        refused = authorize_group(request, group)
        if refused is not None:
            return refused
        doc = services.describe_group(group)
        if doc is None:
            return Response(error_body("GROUP_ID_NOT_FOUND", f"group {group!r} does not exist"), 404)
        return Response(doc)
