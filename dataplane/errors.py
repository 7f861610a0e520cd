"""Errors the data plane raises to the application.

A :class:`ConfigurationError` is fatal only before the member's first accepted join: a wrong
key, an unknown group or an unreachable Redis at start-up cannot heal by retrying, so
``Consumer.run()`` cleans up and raises it. After a successful start the same answers are
taken as transient (a key rotation, a coordinator being redeployed): logged as warnings and
retried with backoff.
"""

from __future__ import annotations

from typing import Any

from .protocol import ErrorCode


class DataplaneError(Exception):
    """Base of the data plane's own errors."""


class ConfigurationError(DataplaneError):
    """The member is set up wrongly: it cannot start as configured."""


class AuthenticationError(ConfigurationError):
    """The coordinator refused the API key (HTTP 401/403)."""


class GroupNotFoundError(ConfigurationError):
    """The coordinator has no such group (HTTP 404 GROUP_ID_NOT_FOUND)."""


class RedisUnavailableError(ConfigurationError):
    """Redis could not be reached when the consumer started."""


def heartbeat_refusal(
    group: str, http_status: int, body: dict[str, Any]
) -> ConfigurationError | None:
    """The configuration error a refused heartbeat means, or None when it means something else
    (fencing, a bad request, a full group: the membership machine's business)."""
    code = body.get("errorCode")
    detail = f"HTTP {http_status} {code}: {body.get('errorMessage')}"
    if http_status in (401, 403):
        return AuthenticationError(f"the coordinator refused the key of group {group!r}: {detail}")
    if http_status == 404 and code == ErrorCode.GROUP_ID_NOT_FOUND:
        return GroupNotFoundError(f"the coordinator has no group {group!r}: {detail}")
    return None


__all__ = [
    "AuthenticationError",
    "ConfigurationError",
    "DataplaneError",
    "GroupNotFoundError",
    "RedisUnavailableError",
    "heartbeat_refusal",
]
