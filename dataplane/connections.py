"""Redis clients of the data plane, standalone or cluster, configured in one place."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

# Errors after which a command may be retried (all our commands and scripts are idempotent).
NET_ERRORS: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError, OSError)


def redis_client(
    url: str,
    *,
    cluster: bool = False,
    socket_timeout: float = 5.0,
    retries: int = 3,
) -> Any:
    """A decoding client with a bounded, short retry of idempotent commands (``retries=0``
    for reading connections: after a failed read the runtime re-reads its own PEL)."""
    kwargs: dict[str, Any] = {
        "decode_responses": True,
        "socket_connect_timeout": 5.0,
        "socket_timeout": socket_timeout,
        "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), retries),
    }
    if cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url, **kwargs)
    return redis.Redis.from_url(url, **kwargs)
