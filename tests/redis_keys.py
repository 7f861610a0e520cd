"""Deleting a test's Redis keys by pattern (tests share a Redis database: never FLUSHDB); the
paged SCAN and batched UNLINK are bench.redis_keys.delete_keys, which the benches use too."""
from __future__ import annotations

from bench.redis_keys import delete_keys

__all__ = ["delete_keys", "delete_stream_keys"]


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
