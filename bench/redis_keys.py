"""Deleting Redis keys by pattern, for the benches and the test suite's cleanups (which share
Redis databases with others: never FLUSHDB). Imports no Django: the benches call it before
Django is set up.

SCAN pages of 1,000 keys: redis-py's default COUNT is 10, and a database holds tens of
thousands of keys once large groups ran (16,384 shard streams each), so one cleanup took
thousands of round trips; the suite once spent about 250,000 SCAN calls on them. UNLINK in
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
