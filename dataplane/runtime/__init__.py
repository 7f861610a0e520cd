"""The consumer runtime on Redis (PROTOCOL.md §7): reads, recovers, dispatches, retries, ACKs.

It knows nothing of the coordinator. Its parts, around one shard table (docs/ARCHITECTURE.md
has the table of files):

- ``shard_table.py``: per-shard status and counts, queued control ops, the one lock;
- ``reader.py``: the reader thread, fenced reads, the blocking wait;
- ``recovery.py``: fence raise and group creation, recovery of pending entries, drain
  detection, the orphan sweep;
- ``workers.py`` / ``async_workers.py``: lanes that keep per-key order, on threads (sync
  handlers) or one event loop (``async def`` handlers);
- ``retry.py``: handler retries with backoff, the DLQ step;
- ``acker.py``: batched, fenced ACKs;
- ``capabilities.py``: XACKDEL or XACK;
- ``facade.py``: :class:`Runtime`, the seam (grant, revoke, abort, in_flight).
"""

from __future__ import annotations

from .capabilities import AckMode, ack_mode_from_capabilities, detect_ack_mode
from .config import RuntimeConfig
from .facade import BatchHandler, Handler, Runtime, is_async_handler
from .shard_table import ShardStatus

__all__ = [
    "AckMode",
    "BatchHandler",
    "Handler",
    "Runtime",
    "RuntimeConfig",
    "ShardStatus",
    "ack_mode_from_capabilities",
    "detect_ack_mode",
    "is_async_handler",
]
