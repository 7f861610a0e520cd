"""Member data-plane of the Redis Stream Coordinator (PROTOCOL.md §7).

Public surface (§7.1)::

    from dataplane import Consumer, Producer, Message

Django-free: depends on redis (with hiredis) and httpx only. The names are imported lazily so
that ``import dataplane.routing`` (the coordinator's use) pulls in neither redis nor httpx.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"  # the distribution's version (pyproject reads it), --version, User-Agent

_LAZY = {
    "Consumer": "consumer",
    "ConsumerStatus": "consumer",
    "Message": "message",
    "Producer": "producer",
    "Sent": "producer",
    "ShardSealedError": "producer",
    "Runtime": "runtime",
    "RuntimeConfig": "runtime",
    "Grant": "membership",
    "Membership": "membership",
    "ShardKeys": "routing",
    "hash64": "routing",
    "hash_range": "routing",
    "shard_index": "routing",
    "HASH_ALGORITHM": "routing",
    "DataplaneError": "errors",
    "ConfigurationError": "errors",
    "AuthenticationError": "errors",
    "GroupNotFoundError": "errors",
    "RedisUnavailableError": "errors",
    "RedisPermissionError": "errors",
    "RedisMismatchError": "errors",
    "InstanceIdReplaced": "errors",
    "BatchItemsFailed": "errors",
}

__all__ = [
    "HASH_ALGORITHM",
    "AuthenticationError",
    "BatchItemsFailed",
    "ConfigurationError",
    "Consumer",
    "ConsumerStatus",
    "DataplaneError",
    "Grant",
    "GroupNotFoundError",
    "InstanceIdReplaced",
    "Membership",
    "Message",
    "Producer",
    "RedisMismatchError",
    "RedisPermissionError",
    "RedisUnavailableError",
    "Runtime",
    "RuntimeConfig",
    "Sent",
    "ShardKeys",
    "ShardSealedError",
    "hash64",
    "hash_range",
    "shard_index",
]

if TYPE_CHECKING:
    from .consumer import Consumer, ConsumerStatus
    from .errors import (
        AuthenticationError,
        BatchItemsFailed,
        ConfigurationError,
        DataplaneError,
        GroupNotFoundError,
        InstanceIdReplaced,
        RedisMismatchError,
        RedisPermissionError,
        RedisUnavailableError,
    )
    from .membership import Grant, Membership
    from .message import Message
    from .producer import Producer, Sent, ShardSealedError
    from .routing import HASH_ALGORITHM, ShardKeys, hash64, hash_range, shard_index
    from .runtime import Runtime, RuntimeConfig


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dataplane' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
