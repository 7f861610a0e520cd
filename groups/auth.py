"""Bearer API keys (one group or one stream each) for the DRF views."""
from __future__ import annotations

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request

from groups.services import KeyScope, resolve_api_key


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
            raise exceptions.AuthenticationFailed("unknown or revoked API key")
        return (None, scope)

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


def require_scope(request: Request) -> KeyScope:
    scope = request.auth
    if not isinstance(scope, KeyScope):
        raise exceptions.NotAuthenticated("an API key is required: Authorization: Bearer <key>")
    return scope


def require_stream_access(request: Request, stream: str, *, groups_allowed: bool) -> KeyScope:
    """A stream key of that stream, or (for read-only routing) a key of a group on it."""
    scope = require_scope(request)
    if scope.group is None and scope.stream == stream:
        return scope
    if groups_allowed and scope.group is not None and scope.stream == stream:
        return scope
    raise exceptions.PermissionDenied(f"this API key does not grant access to stream {stream!r}")
