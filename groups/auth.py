"""Bearer API keys for the DRF views: a group key, or a stream key (produce or admin)."""
from __future__ import annotations

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request

from groups.ratelimit import auth_lookup_retry_after, note_auth_success
from groups.services import (
    KeyScope,
    cached_api_key,
    key_lookup_in_flight,
    recently_valid_key,
    resolve_api_key,
)


class AuthLookupsThrottled(exceptions.Throttled):
    """429 RATE_LIMITED: this address had too many unknown keys looked up (issue 27.10)."""

    def __init__(self, retry: int) -> None:
        super().__init__(detail=f"too many unknown API keys from this address; retry in {retry} s")
        self.wait = retry


class ApiKeyAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[None, KeyScope] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        parts = header.split()
        if len(parts) != 2 or parts[0] != self.keyword:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <key>'")
        known, scope = cached_api_key(parts[1])
        if not known:
            # A database lookup. Beyond AUTH_FAILURE_BURST_PER_IP failed ones from this address
            # (refilled at AUTH_FAILURE_RATE_PER_IP a second), no lookup at all: 429. Only a
            # lookup that may query costs a token: keys the cache knew (expired entries of
            # valid keys) and keys another request is looking up now (it shares that answer)
            # are free, so members that share an address keep working, also in the first
            # burst after a start, when every member's request finds the cache empty.
            address = request.META.get("REMOTE_ADDR", "")
            free = recently_valid_key(parts[1]) or key_lookup_in_flight(parts[1])
            retry = 0 if free else auth_lookup_retry_after(address)
            if retry:
                raise AuthLookupsThrottled(retry)
            try:
                scope = resolve_api_key(parts[1])
            except Exception:
                if not free:  # no answer from the database is no failed key: 503, not 429 later
                    note_auth_success(address)
                raise
            if scope is not None and not free:
                note_auth_success(address)
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
