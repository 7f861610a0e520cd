"""Demo handler: counts what it processed and logs a summary every few seconds (not a line
per message). Handlers must tolerate duplicates (at-least-once)."""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter

from dataplane import Message

log = logging.getLogger("demo.handler")
# `make run` starts the members with -v for their grants and revokes; httpx would add a line
# per heartbeat.
logging.getLogger("httpx").setLevel(logging.WARNING)
MEMBER = os.environ.get("DEMO_MEMBER", "member")
SUMMARY_EVERY_S = 5.0

_lock = threading.Lock()
_by_shard: Counter[str] = Counter()
_total = 0
_redelivered = 0
_last_summary = time.monotonic()


def handle(msg: Message) -> None:
    global _total, _redelivered, _last_summary
    with _lock:  # handlers run on the consumer's worker threads
        _by_shard[msg.shard] += 1
        _total += 1
        _redelivered += msg.delivery_count > 1
        now = time.monotonic()
        if now - _last_summary < SUMMARY_EVERY_S:
            return
        shards = ", ".join(f"{s} {n}" for s, n in sorted(_by_shard.items()))
        log.info("%s handled %d messages in the last %.0f s (%s); %d in all, %d redelivered",
                 MEMBER, sum(_by_shard.values()), now - _last_summary, shards, _total, _redelivered)
        _by_shard.clear()
        _last_summary = now
