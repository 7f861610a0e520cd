"""Bearer API keys for the DRF views: a group key, or a stream key (produce or admin)."""
from __future__ import annotations

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request
from rest_framework.response import Response

from groups.api_errors import error_body
from groups.selectors import group_exists
from groups.services import KeyScope, resolve_api_key, url_name_problem


class ApiKeyAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[None, KeyScope] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        parts = header.split()
        if len(parts) != 2 or parts[0] != self.keyword:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <key>'")
        scope = resolve_api_key(parts[1])
        if scope is None:
            raise exceptions.AuthenticationFailed("unknown, revoked or expired API key")
        return (None, scope)

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


def require_scope(request: Request) -> KeyScope:
    scope = request.auth
    if not isinstance(scope, KeyScope):
        raise exceptions.NotAuthenticated("an API key is required: Authorization: Bearer <key>")
    return scope


def require_stream_access(request: Request, stream: str, *, reshard: bool) -> KeyScope:
    """Routing: a key of the stream or of a group on it. Reshard: the stream's admin key."""
    scope = require_scope(request)
    if reshard and scope.stream == stream and not scope.may_reshard(stream):
        raise exceptions.PermissionDenied(
            f"this API key ({scope.role}) may not reshard stream {stream!r}; use a stream admin key"
        )
    allowed = scope.may_reshard(stream) if reshard else scope.may_route(stream)
    if allowed:
        return scope
    raise exceptions.PermissionDenied(f"this API key does not grant access to stream {stream!r}")


def authorize_group(request: Request, group: str) -> Response | None:
    """401 without a key, 400 for a name no group can have, 404 for no such group, 403 for
    another group's key."""
    scope: KeyScope = require_scope(request)
    if scope.group == group:
        return None
    problem = url_name_problem("group", group)
    if problem is not None:
        return Response(error_body("INVALID_REQUEST", problem), 400)
    if not group_exists(group):
        return Response(error_body("GROUP_ID_NOT_FOUND", f"group {group!r} does not exist"), 404)
    return Response(
        error_body("AUTHORIZATION_FAILED", f"this API key does not grant access to group {group!r}"), 403
    )
