"""Handlers run by the e2e member processes (``--handler tests.e2e.handlers:record``).

Every successful handling is appended to a result stream in Redis, so the test sees one total
order of handlings across processes (Redis serialises the XADDs) and nothing is lost to a
SIGKILL (an XADD either happened or not). Configured by environment, per process:

- ``E2E_REDIS_URL``, ``E2E_RESULTS``: where to record;
- ``E2E_MEMBER``: the member id written into each record;
- ``E2E_GATE``: a Redis list; a message with field ``gate=1`` blocks its handler until an
  element is pushed there (announced first by ``SET <E2E_GATE>:waiting <id>``).

Messages choose failures with a ``fail`` field: ``always`` (poison: raises on every delivery)
or ``once`` (raises on its first delivery only).
"""

from __future__ import annotations

import os
from typing import Any

import redis

from dataplane import Message

_redis = redis.Redis.from_url(os.environ["E2E_REDIS_URL"], decode_responses=True)
RESULTS = os.environ["E2E_RESULTS"]
MEMBER = os.environ.get("E2E_MEMBER", "")
GATE = os.environ.get("E2E_GATE", "")
PID = str(os.getpid())


class HandlerFailure(RuntimeError):
    pass


def check_failure(msg: Message) -> None:
    fail = msg.fields.get("fail")
    if fail == "always":
        raise HandlerFailure(f"poison message for key {msg.key}")
    if fail == "once" and msg.delivery_count < 2:
        raise HandlerFailure(f"transient failure for key {msg.key} (delivery {msg.delivery_count})")


def wait_gate(msg: Message) -> None:
    if GATE and msg.fields.get("gate") == "1":
        _redis.set(f"{GATE}:waiting", msg.id)
        _redis.blpop([GATE], timeout=120)


def record(msg: Message, **extra: Any) -> None:
    wait_gate(msg)
    check_failure(msg)
    _redis.xadd(
        RESULTS,
        {
            "shard": msg.shard,
            "id": msg.id,
            "key": msg.key,
            "seq": msg.fields.get("seq", ""),
            "member": MEMBER,
            "pid": PID,
            "dc": msg.delivery_count,
            **extra,
        },
    )


def client() -> redis.Redis:
    return _redis
