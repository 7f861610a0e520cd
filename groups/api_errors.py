"""Every API error as the protocol's error body: errorCode, errorMessage, never a 500 page."""
from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from coordinator_project.compat.django import mark_logged
from coordinator_project.logging import LogThrottle
from coordinator_project.migration_state import missing_schema
from coordinator_project.process_state import PROCESS
from dataplane.protocol import ErrorCode
from groups.api_parsers import PayloadTooLarge, payload_too_large

log = logging.getLogger(__name__)


def error_body(code: ErrorCode, message: str, member_id: str | None = None) -> dict[str, Any]:
    """§3: an error carries errorCode, errorMessage and, where known, memberId; nothing else."""
    body: dict[str, Any] = {"errorCode": ErrorCode(code).value, "errorMessage": message}
    if member_id is not None:
        body["memberId"] = member_id
    return body


def flatten_errors(detail: Any, path: str = "") -> list[str]:
    """DRF's nested error dict → ["revokingShards[0].state: ...", ...]."""
    if isinstance(detail, dict):
        out: list[str] = []
        for key, value in detail.items():
            if key == "non_field_errors":
                sub = path
            elif isinstance(key, int) or str(key).isdigit():
                sub = f"{path}[{key}]"
            else:
                sub = f"{path}.{key}" if path else str(key)
            out.extend(flatten_errors(value, sub))
        return out
    if isinstance(detail, list):
        out = []
        for item in detail:
            out.extend(flatten_errors(item, path))
        return out
    return [f"{path or 'body'}: {detail}"]


# Bad keys are free to repeat: one warning line per 10 s (with a count), not one per request.
_auth_refusals = PROCESS.own(
    "authentication refusal log throttle", LogThrottle(every=10.0),
    "One warning line per 10 s for bad keys."
    " key: a refusal's kind -> when its last line was logged, lines held since; bound: 1,000 kinds, then emptied; invalidated: every 10 s per kind; N hosts: per process by design (each logs its own lines).",
)


def _log_refusal_once(response: Response, context: dict[str, Any], code: ErrorCode = ErrorCode.AUTHENTICATION_FAILED) -> None:
    mark_logged(response)  # no django.request line per request
    if getattr(context.get("view"), "logs_refusals", False):
        return  # the heartbeat view logs its refusals itself (metrics.record_heartbeat)
    held = _auth_refusals.allow(code)
    if held is not None:
        request = context.get("request")
        log.warning("API request refused: %s %s %s%s", response.status_code, getattr(request, "method", "?"),
                    getattr(request, "path", "?").encode("unicode_escape").decode(),
                    f" ({held} more not logged in the last {_auth_refusals.every:g} s)" if held else "")


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, RequestDataTooBig):  # Django's own check, from request.body
        exc = payload_too_large(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    if isinstance(exc, PayloadTooLarge):
        return Response(error_body(ErrorCode.INVALID_REQUEST, str(exc.detail)), 413)
    if isinstance(exc, exceptions.ParseError):
        return Response(error_body(ErrorCode.INVALID_REQUEST, f"body: not valid JSON ({exc.detail})"), 400)
    if isinstance(exc, exceptions.UnsupportedMediaType):
        return Response(error_body(ErrorCode.INVALID_REQUEST, f"body: {exc.detail}"), 415)
    if isinstance(exc, exceptions.ValidationError):
        return Response(error_body(ErrorCode.INVALID_REQUEST, "; ".join(flatten_errors(exc.detail))), 400)
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        response = Response(error_body(ErrorCode.AUTHENTICATION_FAILED, str(exc.detail)), 401)
        response["WWW-Authenticate"] = "Bearer"
        _log_refusal_once(response, context)
        return response
    if isinstance(exc, exceptions.Throttled):  # groups.auth: too many unknown keys from an address
        response = Response(error_body(ErrorCode.RATE_LIMITED, str(exc.detail)), 429)
        response["Retry-After"] = str(int(getattr(exc, "wait", None) or 1))
        _log_refusal_once(response, context, ErrorCode.RATE_LIMITED)
        return response
    if isinstance(exc, exceptions.PermissionDenied):
        return Response(error_body(ErrorCode.AUTHORIZATION_FAILED, str(exc.detail)), 403)
    if isinstance(exc, (OperationalError, InterfaceError)) or missing_schema(exc):
        # Re-raised: coordinator_project.middleware answers 503 COORDINATOR_UNAVAILABLE (and
        # decides whether a missing column is a missing migrate or a bug, which keeps its 500).
        return None
    handled = drf_exception_handler(exc, context)
    if handled is not None:
        code = ErrorCode.INVALID_REQUEST if handled.status_code < 500 else ErrorCode.INTERNAL_ERROR
        handled.data = error_body(code, str(getattr(exc, "detail", exc)))
        return handled
    log.exception("unhandled API error", exc_info=exc)
    return Response(
        error_body(ErrorCode.INTERNAL_ERROR, "internal error; see the coordinator log"),
        status.HTTP_500_INTERNAL_SERVER_ERROR,
    )
