"""Django's own error pages as the protocol's error body (issue 27.10).

Unknown URLs, a bad `Host` header, a failed CSRF check outside the admin and uncaught errors
answer `{errorCode, errorMessage}` JSON like every API error (groups.api_errors), not
Django's HTML pages. Only the admin (/admin/) keeps Django's HTML pages: a browser shows them.
Nothing here may call `request.get_host()`: a DisallowedHost 400 comes through here.
"""
from __future__ import annotations

from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from django.views.csrf import csrf_failure as django_csrf_failure

from dataplane.protocol import ErrorCode
from groups.api_errors import error_body

ADMIN_PREFIX = "/admin/"


def _html(request: HttpRequest) -> bool:
    return request.path.startswith(ADMIN_PREFIX)


def _json(status: int, code: ErrorCode, message: str) -> JsonResponse:
    return JsonResponse(error_body(code, message), status=status)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if isinstance(exception, DisallowedHost):
        return _json(400, ErrorCode.INVALID_REQUEST, "Host: not a host this coordinator serves (ALLOWED_HOSTS)")
    if _html(request):
        return defaults.bad_request(request, exception)  # type: ignore[arg-type]
    return _json(400, ErrorCode.INVALID_REQUEST, "request: bad request")


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _html(request):
        return defaults.permission_denied(request, exception)  # type: ignore[arg-type]
    return _json(403, ErrorCode.AUTHORIZATION_FAILED, "request: forbidden")


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _html(request):
        return defaults.page_not_found(request, exception)
    # The path is not echoed: it is the client's own, and may carry anything.
    return _json(404, ErrorCode.INVALID_REQUEST, "url: no such endpoint (see /api/schema/)")


def server_error(request: HttpRequest) -> HttpResponse:
    if _html(request):
        return defaults.server_error(request)
    return _json(500, ErrorCode.INTERNAL_ERROR, "internal error; see the coordinator log")


def method_not_allowed(response: HttpResponse) -> HttpResponse:
    """A function view's 405 (require_safe, require_POST: an empty text/html body) as JSON,
    keeping its Allow header."""
    allowed = response.get("Allow", "")
    refused = _json(405, ErrorCode.INVALID_REQUEST, f"method: not allowed here (allowed: {allowed})")
    if allowed:
        refused["Allow"] = allowed
    return refused


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: the admin's HTML page there; JSON elsewhere (the API is exempt, DRF
    views take no session authentication, so this is a POST to a non-API URL)."""
    if _html(request):
        return django_csrf_failure(request, reason)
    return _json(403, ErrorCode.AUTHORIZATION_FAILED, f"request: CSRF check failed ({reason})")
