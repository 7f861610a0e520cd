"""Deleting a test's Redis keys by pattern (tests share a Redis database: never FLUSHDB).

SCAN pages of 1,000 keys: redis-py's default COUNT is 10, and a worker's database holds tens
of thousands of keys once the large-group tests ran (16,384 shard streams each), so one cleanup
took thousands of round trips; the suite spent about 250,000 SCAN calls on them. UNLINK in
batches: one round trip per 1,000 keys, freed off Redis's main thread."""
from __future__ import annotations

from typing import Any

PAGE = 1000


def delete_keys(client: Any, pattern: str, keep: frozenset[Any] = frozenset()) -> int:
    """UNLINK every key matching `pattern` except those in `keep`; how many went."""
    deleted, batch = 0, []
    for key in client.scan_iter(match=pattern, count=PAGE):
        if key not in keep:
            batch.append(key)
        if len(batch) >= PAGE:
            deleted += client.unlink(*batch)
            batch.clear()
    if batch:
        deleted += client.unlink(*batch)
    return deleted


def delete_stream_keys(stream: str) -> int:
    """UNLINK the coordinator's keys of `stream` (shard streams, seal markers, fence tokens)
    in the test's stream Redis, under any installation's prefix; how many went."""
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.STREAM_REDIS_URL)
    try:
        return delete_keys(client, f"rsc*:{{{stream}:*")
    finally:
        client.close()
