"""Errors the data plane raises to the application.

A :class:`ConfigurationError` is fatal only before the member's first accepted join: a wrong
key, an unknown group or an unreachable Redis at start-up cannot heal by retrying, so
``Consumer.run()`` cleans up and raises it. After a successful start the same answers are
taken as transient (a key rotation, a coordinator being redeployed): logged as warnings and
retried with backoff, until they persist for ``Consumer(refusal_timeout_s=...)`` with the
session lost: then ``run()`` raises them too. :class:`InstanceIdReplaced` is fatal whenever
it comes: another process joined with the same instance id (two processes configured alike),
and the newest wins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from redis.exceptions import NoPermissionError

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


class RedisPermissionError(ConfigurationError):
    """The Redis user may not run a command the member needs (ACL ``NOPERM``, issue 27.6): it
    could neither read, ACK nor dead-letter, so ``Consumer.run()`` leaves and raises this
    instead of heartbeating on while holding shards it cannot serve. Fatal whenever it comes:
    an ACL does not heal by retrying."""

    def __init__(self, what: str, exc: BaseException) -> None:
        self.what = what
        super().__init__(
            f"the Redis user may not {what}: {exc} (grant the member role of docs/SECURITY.md)"
        )


class RedisMismatchError(ConfigurationError):
    """The member's Redis is not the coordinator's stream Redis (issue 25.4): its
    ``<keyPrefix>:identity`` is missing or holds another installation id than the heartbeat
    metadata's ``installationId`` (a wrong database number, host or port). Checked after the
    join, before the first read: the member creates nothing there, leaves the group and
    ``Consumer.run()`` raises this; ``consume`` exits 2 with one line."""

    def __init__(self, redis_url: str, key: str, found: str | None, expected: str) -> None:
        self.key = key
        self.found = found
        self.expected = expected
        where = safe_url(redis_url)
        if found is None:
            what = (f"Redis {where} holds no {key}: it is not the coordinator's stream Redis "
                    f"(installation {expected})")
        else:
            what = (f"Redis {where} belongs to installation {found} ({key}), the coordinator is "
                    f"installation {expected}")
        super().__init__(
            f"{what}; nothing was read or written there. Check --redis (host, port, database); "
            "if it is the right Redis, run `manage.py publish_identity` on the coordinator"
        )


def safe_url(url: str) -> str:
    """The URL without its password."""
    return re.sub(r"(//[^:/@]*):[^@/]*@", r"\1:***@", url)


class InstanceIdReplaced(ConfigurationError):
    """Another process joined with this member's instance id and took its place (PROTOCOL.md
    §9 R1s; Kafka's FENCED_INSTANCE_ID): this one has aborted its shards and stops, rather
    than rejoining and replacing the newer one in turn."""

    def __init__(self, instance_id: str, member_id: str, by_member_id: str | None) -> None:
        self.instance_id = instance_id
        self.member_id = member_id
        self.by_member_id = by_member_id  # the replacing memberId, when the coordinator said
        by = f" (member {by_member_id})" if by_member_id else ""
        super().__init__(
            f"another process joined with instance id {instance_id}{by}; this one stops"
        )


class BatchItemsFailed(Exception):
    """Raised by a batch handler to say which messages of the batch failed (by message id,
    with their error); the others count as handled and are ACKed. Only the failed ones are
    retried (as a smaller batch) or dead-lettered after ``max_deliveries``. Any other exception
    fails the whole batch."""

    def __init__(self, failed: Mapping[str, Exception | str] | Iterable[str]) -> None:
        items = failed.items() if isinstance(failed, Mapping) else ((i, "failed") for i in failed)
        self.failed: dict[str, Exception] = {
            i: e if isinstance(e, Exception) else RuntimeError(str(e)) for i, e in items
        }
        super().__init__(f"{len(self.failed)} messages of the batch failed")


def is_noperm(exc: BaseException) -> bool:
    """A Redis ACL refusal (``NOPERM``), also when it comes wrapped (EXECABORT, a script)."""
    if isinstance(exc, NoPermissionError | RedisPermissionError):
        return True
    text = str(exc)  # redis-py drops the NOPERM code of an error it wraps (EXECABORT)
    return "NOPERM" in text or "no permissions to" in text


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
    "BatchItemsFailed",
    "ConfigurationError",
    "DataplaneError",
    "GroupNotFoundError",
    "InstanceIdReplaced",
    "RedisMismatchError",
    "RedisPermissionError",
    "RedisUnavailableError",
    "heartbeat_refusal",
    "is_noperm",
]
