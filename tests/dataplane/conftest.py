"""Fixtures for the data-plane tests: real Redis (db 9, unique key prefixes), no Django."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REDIS_URL = os.environ.get("DATAPLANE_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")


@pytest.fixture(scope="session")
def redis_url() -> str:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:  # pragma: no cover - environment problem
        pytest.fail(f"the data-plane tests need Redis at {REDIS_URL}: {exc}")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def prefix(r: redis.Redis) -> Iterator[str]:
    """A key prefix no other test uses; its keys are deleted afterwards (never FLUSHALL)."""
    p = f"t-{uuid.uuid4().hex[:10]}"
    yield p
    keys = list(r.scan_iter(match=f"{p}:*", count=1000))
    if keys:
        r.delete(*keys)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.01, what: str = "") -> None:
    """Poll ``predicate`` until it is true, failing after ``timeout`` seconds (no blind sleeps)."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def make_grant(prefix: str, shard: str, epoch: int = 1, member: str = "m-1", start: str = "0"):
    from dataplane.membership import Grant
    from dataplane.routing import ShardKeys

    keys = ShardKeys(shard, prefix)
    return Grant(shard, epoch, member, keys.stream, keys.sealed, start, prefix)


@pytest.fixture
def runtimes(redis_url: str) -> Iterator[list]:
    """Runtimes started by a test; all stopped afterwards."""
    started: list = []
    yield started
    for rt in started:
        rt.stop(timeout=5.0)


@pytest.fixture
def start_runtime(redis_url: str, runtimes: list):
    from dataplane.runtime import Runtime, RuntimeConfig

    def _start(handler, group: str = "g", consumer: str = "m-1", **cfg) -> Runtime:
        cfg.setdefault("block_ms", 200)
        cfg.setdefault("retry_backoff_ms", 1)
        rt = Runtime(redis_url, group, consumer, handler, RuntimeConfig(**cfg))
        rt.start()
        runtimes.append(rt)
        return rt

    return _start
