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
