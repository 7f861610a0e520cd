"""Demo handler: logs what it processed. Handlers must tolerate duplicates (at-least-once)."""
from __future__ import annotations

import logging
import os

from dataplane import Message

log = logging.getLogger("demo.handler")
MEMBER = os.environ.get("DEMO_MEMBER", "member")


def handle(msg: Message) -> None:
    log.info("%s handled %s %s key=%s fields=%s (delivery %d)", MEMBER, msg.shard, msg.id, msg.key,
             msg.fields, msg.delivery_count)
