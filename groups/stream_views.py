"""GET /api/v1/streams/{stream}/routing (producers) and POST .../reshard (operators, §6)."""
from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from assignments.serializers import ErrorBodySerializer
from dataplane.protocol import ErrorCode
from dataplane.routing import HASH_ALGORITHM
from groups.api_errors import error_body
from groups.auth import require_scope, require_stream_access
from groups.errors import ServiceError
from groups.metadata import routing_document
from groups.models import Stream, StreamState, VersionState
from groups.namespace import observe_generation
from groups.resharding import ReshardInProgress, StreamNotFound, start_reshard
from groups.services import url_name_problem

# §3/§6: a version, not its shards; dataplane.routing.ShardVersion derives every shard's id,
# Redis keys, hash range and parents from these fields.
_version = inline_serializer("RoutedVersion", {
    "stream": serializers.CharField(),
    "version": serializers.IntegerField(),
    "state": serializers.ChoiceField(choices=[s.value for s in VersionState if s != VersionState.RETIRED]),
    "shardCount": serializers.IntegerField(help_text="shard i is '<stream>:<version>:<i>', i < shardCount"),
    "parentVersion": serializers.IntegerField(allow_null=True, help_text="the version its shards' parents are in; null for the first"),
    "parentShardCount": serializers.IntegerField(allow_null=True),
    "keyPrefix": serializers.CharField(help_text="redisKey = '<keyPrefix>:{<shardId>}', sealKey = redisKey + ':sealed'"),
}, many=True)
_routing = inline_serializer("Routing", {
    "stream": serializers.CharField(),
    "writeVersion": serializers.IntegerField(),
    "metadataEpoch": serializers.IntegerField(),
    "state": serializers.ChoiceField(choices=StreamState.values),
    "hash": serializers.CharField(help_text=HASH_ALGORITHM),
    "keyPrefix": serializers.CharField(),
    "versions": _version,
})
_reshard_request = inline_serializer("ReshardRequest", {"shards": serializers.IntegerField(min_value=1)})
_reshard_response = inline_serializer("ReshardStarted", {
    "stream": serializers.CharField(),
    "version": serializers.IntegerField(),
    "shardCount": serializers.IntegerField(),
    "state": serializers.CharField(),
    "routing": _routing,
})
_error = ErrorBodySerializer


def _authorize(request: Request, stream: str, *, reshard: bool) -> Response | None:
    """401 without a key, 400 for a name no stream can have, 404 for no such stream, 403 for
    a key of anything else."""
    scope = require_scope(request)
    if scope.stream != stream:
        problem = url_name_problem("stream", stream)
        if problem is not None:
            return Response(error_body(ErrorCode.INVALID_REQUEST, problem), 400)
        if not Stream.objects.filter(name=stream).exists():
            return Response(error_body(ErrorCode.STREAM_NOT_FOUND, f"stream {stream!r} does not exist"), 404)
    require_stream_access(request, stream, reshard=reshard)
    return None


class RoutingView(APIView):
    @extend_schema(
        responses={200: _routing, 401: _error, 403: _error, 404: _error},
        summary="Producer routing: write version, shard ranges and Redis keys of every live version",
    )
    def get(self, request: Request, stream: str) -> Response:
        refused = _authorize(request, stream, reshard=False)
        if refused is not None:
            return refused
        row = Stream.objects.filter(name=stream).first()
        if row is None:
            return Response(error_body(ErrorCode.STREAM_NOT_FOUND, f"stream {stream!r} does not exist"), 404)
        observe_generation()  # the document is cached by an epoch a restore can rewind
        return Response(routing_document(row))


class ReshardView(APIView):
    @extend_schema(
        request=_reshard_request,
        responses={
            202: OpenApiResponse(_reshard_response, description="version v+1 created; the stream is PREPARING"),
            400: _error, 401: _error, 403: _error, 404: _error,
            409: OpenApiResponse(_error, description="RESHARD_IN_PROGRESS: the stream is not STABLE"),
        },
        summary="Start resharding a stream to N shards (stream admin key only; at most MAX_SHARDS_PER_STREAM)",
    )
    def post(self, request: Request, stream: str) -> Response:
        refused = _authorize(request, stream, reshard=True)
        if refused is not None:
            return refused
        body: Any = request.data
        if not isinstance(body, dict) or "shards" not in body:
            return Response(error_body(ErrorCode.INVALID_REQUEST, 'body: a JSON object {"shards": N} is required'), 400)
        unknown = sorted(set(body) - {"shards"})
        if unknown:
            return Response(error_body(ErrorCode.INVALID_REQUEST, f"body: unknown field(s) {', '.join(unknown)}"), 400)
        try:
            version = start_reshard(stream, body["shards"], actor=f"api-key:{require_scope(request).key_id}")
        except StreamNotFound as exc:
            return Response(error_body(ErrorCode.STREAM_NOT_FOUND, str(exc)), 404)
        except ReshardInProgress as exc:
            return Response(error_body(ErrorCode.RESHARD_IN_PROGRESS, str(exc)), 409)
        except ServiceError as exc:
            return Response(error_body(ErrorCode.INVALID_REQUEST, str(exc)), 400)
        row = Stream.objects.get(name=stream)
        observe_generation()
        return Response(
            {"stream": stream, "version": version.version, "shardCount": version.shard_count,
             "state": row.state, "routing": routing_document(row)},
            status=202,
        )
