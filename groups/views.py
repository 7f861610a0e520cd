"""GET /api/v1/groups/{group} (describe, §10); POST .../pause and .../resume (§11)."""
from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from assignments.serializers import ErrorBodySerializer
from coordination.liveness import Liveness
from coordination.model import LIVE_STATUSES, GroupPhase, MemberStatus, ShardState
from dataplane.protocol import ErrorCode
from groups.access import authorize_group
from groups.api_errors import error_body
from groups.auth import require_scope
from groups.describe import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, describe_group
from groups.errors import ServiceError
from groups.models import Group
from groups.services import pause_group, resume_group, url_name_problem

_shard_list = serializers.ListField(child=serializers.CharField())
_member = inline_serializer("DescribedMember", {
    "memberId": serializers.CharField(),
    "instanceId": serializers.CharField(allow_null=True, help_text="static membership (§9); null for dynamic members"),
    "clientId": serializers.CharField(),
    "libraryVersion": serializers.CharField(
        help_text="the member's client library and version from its join's User-Agent (e.g. rsc-dataplane/0.2.0); "
        "empty when it named none"),
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
    "expiresInS": serializers.IntegerField(allow_null=True, help_text="seconds until this temporarily left member expires (L1s); null for any other member"),
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
    "paused": serializers.BooleanField(help_text="the group is paused (§11): members hold their shards and read nothing"),
    "pausedAt": serializers.DateTimeField(allow_null=True),
    "pausedBy": serializers.CharField(allow_null=True, help_text="who paused it (cli:<user>, admin:<user>, api-key:<id>)"),
    "memberCounts": serializers.DictField(
        child=serializers.IntegerField(), help_text="live members of the whole group by state (issue 26.3)"),
    "shardCounts": serializers.DictField(
        child=serializers.IntegerField(), help_text="live shards of the whole group by state"),
    "paging": inline_serializer("DescribedPaging", {
        "page": serializers.IntegerField(help_text="this page, from 1"),
        "pageSize": serializers.IntegerField(allow_null=True, help_text="members and shards per page"),
        "members": serializers.IntegerField(help_text="live members in the group"),
        "shards": serializers.IntegerField(help_text="live shards in the group"),
        "lastPage": serializers.IntegerField(help_text="the last page that lists a member or a shard"),
    }),
    "members": serializers.ListField(child=_member, help_text="this page's live members, by memberId"),
    "shards": serializers.ListField(child=_shard, help_text="this page's shards, in shard order"),
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


def _positive(request: Request, name: str, default: int, most: int) -> int | str:
    """A query parameter that must be a whole number from 1 to `most`, or the problem with it."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= most:
        return f"{name}: {raw[:40]!r} is not a whole number from 1 to {most}"
    return int(raw)


class DescribeGroupView(APIView):
    @extend_schema(
        responses={200: _described, 400: ErrorBodySerializer},
        parameters=[
            OpenApiParameter("page", int, description="the page of members and shards, from 1 (default 1)"),
            OpenApiParameter("pageSize", int, description=(
                f"members and shards per page, 1 to {MAX_PAGE_SIZE} (default {DEFAULT_PAGE_SIZE})")),
        ],
        summary="Describe a group: epochs, counts, a page of members and of shards with lag, pending and DLQ length",
    )
    def get(self, request: Request, group: str) -> Response:
        refused = authorize_group(request, group)
        if refused is not None:
            return refused
        page = _positive(request, "page", 1, 10**9)
        size = _positive(request, "pageSize", DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        for value in (page, size):
            if isinstance(value, str):
                return Response(error_body(ErrorCode.INVALID_REQUEST, value), 400)
        doc = describe_group(group, page=int(page), page_size=int(size))
        if doc is None:
            return Response(error_body(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group!r} does not exist"), 404)
        return Response(doc)


_paused = inline_serializer("GroupPauseState", {
    "group": serializers.CharField(),
    "paused": serializers.BooleanField(),
    "changed": serializers.BooleanField(help_text="false: it already was in that state"),
    "pausedAt": serializers.DateTimeField(allow_null=True),
})


class _PauseView(APIView):
    """§11 over HTTP, with the admin key of the group's stream (the key that may reshard it)."""

    pause = True

    def post(self, request: Request, group: str) -> Response:
        scope = require_scope(request)
        problem = url_name_problem("group", group)
        if problem is not None:
            return Response(error_body(ErrorCode.INVALID_REQUEST, problem), 400)
        row = Group.objects.select_related("stream").filter(name=group).first()
        if row is None:
            return Response(error_body(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group!r} does not exist"), 404)
        if not scope.may_reshard(row.stream.name):
            return Response(error_body(
                ErrorCode.AUTHORIZATION_FAILED,
                f"pausing or resuming group {group!r} needs the admin key of stream {row.stream.name!r}",
            ), 403)
        action = pause_group if self.pause else resume_group
        try:
            changed = action(group, actor=f"api-key:{scope.key_id}")
        except ServiceError as exc:  # deleted meanwhile
            return Response(error_body(ErrorCode.GROUP_ID_NOT_FOUND, str(exc)), 404)
        row.refresh_from_db(fields=["paused_at"])
        return Response({"group": group, "paused": row.paused_at is not None, "changed": changed,
                         "pausedAt": row.paused_at.isoformat() if row.paused_at else None})


_PAUSE_RESPONSES = {200: _paused, 400: ErrorBodySerializer, 401: ErrorBodySerializer,
                    403: ErrorBodySerializer, 404: ErrorBodySerializer}


class PauseGroupView(_PauseView):
    pause = True

    @extend_schema(request=None, responses=_PAUSE_RESPONSES,
                   summary="Pause a group: members finish in-flight work, then read nothing (stream admin key; §11)")
    def post(self, request: Request, group: str) -> Response:
        return super().post(request, group)


class ResumeGroupView(_PauseView):
    pause = False

    @extend_schema(request=None, responses=_PAUSE_RESPONSES,
                   summary="Resume a paused group: members read again from where they stopped (stream admin key; §11)")
    def post(self, request: Request, group: str) -> Response:
        return super().post(request, group)
