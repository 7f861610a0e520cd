"""POST /api/v1/groups/{group}/heartbeat."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponseBase
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from assignments import encoder, services
from assignments.answers import WireBody
from assignments.serializers import (
    ErrorBodySerializer,
    HeartbeatRequestSerializer,
    HeartbeatResponseSerializer,
)
from coordination.wire import InvalidRequest, library_version, parse_heartbeat
from coordinator_project.compat.django import mark_logged
from coordinator_project.compat.drf import http_request, parsed_data
from coordinator_project.metrics import record_heartbeat
from coordinator_project.wsgi_guard import RequestDeadlineExceeded
from dataplane.protocol import JOIN_EPOCH, LEAVE_EPOCH, TEMPORARY_LEAVE_EPOCH, ErrorCode
from groups.access import authorize_group
from groups.api_errors import error_body
from groups.api_parsers import BoundedJSONParser
from groups.auth import require_scope
from groups.ratelimit import join_retry_after, leave_retry_after
from members.intake import note_heartbeat_failed


class JsonOnly(BaseContentNegotiation):
    """The heartbeat speaks JSON only: skip DRF's Accept-header negotiation (5 % of a
    steady-state heartbeat's CPU in a py-spy profile under load)."""

    def select_parser(self, request: Request, parsers: Iterable[BaseParser]) -> BaseParser:
        return next(iter(parsers))

    def select_renderer(self, request: Request, renderers: Iterable[BaseRenderer],
                        format_suffix: str | None = None) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


class HeartbeatRenderer(JSONRenderer):
    """JSONRenderer for the encoder's bodies (`assignments.encoder.render`: a memoized answer
    rendered once, the metadata document's cached text spliced in)."""

    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: Mapping[str, Any] | None = None) -> bytes:
        if (isinstance(data, WireBody)
                and self.get_indent(accepted_media_type or "", renderer_context or {}) is None):
            base = super().render
            return encoder.render(data, lambda d: base(d, accepted_media_type, renderer_context))
        return super().render(data, accepted_media_type, renderer_context)


class HeartbeatView(APIView):
    parser_classes = [BoundedJSONParser]
    renderer_classes = [HeartbeatRenderer]
    content_negotiation_class = JsonOnly
    logs_refusals = True  # record_heartbeat logs every refusal (rate-limited where repeatable)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        started = time.perf_counter()  # every outcome (auth, validation, core) is counted
        try:
            response = super().dispatch(request, *args, **kwargs)
        except (OperationalError, InterfaceError, RequestDeadlineExceeded):
            # Issue 27.3: unanswered because of the database (coordinator_project.middleware's
            # UNAVAILABLE_ERRORS), or still waiting on it when the request's deadline dropped it
            # (wsgi_guard): the intake was down, so L1/L2 count no silence before now. The
            # middleware or the guard answers the 503.
            note_heartbeat_failed()
            raise
        # The body only if the view parsed it: an unauthenticated body is never parsed for a log.
        record_heartbeat(kwargs.get("group", ""), parsed_data(getattr(self, "request", None)),
                         getattr(response, "data", None), time.perf_counter() - started,
                         getattr(response, "heartbeat_path", ""))
        # record_heartbeat logged it (rate-limited); skip django.request's second warning line.
        mark_logged(response)
        return response

    @extend_schema(
        request=HeartbeatRequestSerializer,
        responses={
            200: OpenApiResponse(HeartbeatResponseSerializer),
            **{code: OpenApiResponse(ErrorBodySerializer) for code in (400, 401, 403, 404, 409, 413, 429)},
        },
        summary="Member heartbeat: join (epoch 0), leave (-1), or regular (>0)",
    )
    def post(self, request: Request, group: str) -> Response:
        refused = authorize_group(request, group)
        if refused is not None:
            return refused
        if not http_request(request).body.strip():  # DRF proxies attribute reads slowly
            return Response(error_body(ErrorCode.INVALID_REQUEST, "body: empty; a JSON object is required"), 400)
        try:
            req = parse_heartbeat(request.data)
        except InvalidRequest as exc:
            return Response(error_body(ErrorCode.INVALID_REQUEST, str(exc)), 400)
        # Joins and leaves change membership (a recompute, events, a tombstone): refused
        # beyond their rates before the group lock, so one key's churn is bounded.
        if req.member_epoch in (JOIN_EPOCH, LEAVE_EPOCH, TEMPORARY_LEAVE_EPOCH):
            join = req.member_epoch == JOIN_EPOCH
            limit = join_retry_after if join else leave_retry_after
            retry = limit(require_scope(request).key_id, request.META.get("REMOTE_ADDR", ""))
            if join:  # issue 25.7: the member's library, recorded with the join's own write
                req = dataclasses.replace(req, library_version=library_version(request.META.get("HTTP_USER_AGENT")))
            if retry:
                refused = Response(error_body(
                    ErrorCode.RATE_LIMITED, f"too many {'joins' if join else 'leaves'} with this API key "
                    f"or from this address; retry in {retry} s", req.member_id), 429)
                refused["Retry-After"] = str(retry)
                return refused
        result = services.heartbeat(group, req)  # its time: when it applies (services.heartbeat)
        response = Response(encoder.response_body(result), status=result.response.http_status)
        response.heartbeat_path = result.path  # type: ignore[attr-defined]  # the metric's label
        return response
