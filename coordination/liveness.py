"""Liveness at a glance (alive / late / expired), the one classifier every view uses.

The matrix, the members admin (row label and list filter), describe, `describe_group` and the
metrics all classify through here, so "late" means the same thing everywhere: silent for
more than LATE_AFTER_INTERVALS heartbeat intervals; "expired": silent beyond the session
timeout (the next L1 sweep removes it). Pure: time enters as `now`.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

LATE_AFTER_INTERVALS = 2


class Liveness(StrEnum):
    ALIVE = "alive"
    LATE = "late"  # more than LATE_AFTER_INTERVALS heartbeat intervals silent
    EXPIRED = "expired"  # beyond the session timeout: the next sweep removes it (L1)
    UNKNOWN = "unknown"  # never heartbeated


def late_after(heartbeat_interval_ms: int) -> timedelta:
    return timedelta(milliseconds=LATE_AFTER_INTERVALS * heartbeat_interval_ms)


def liveness(
    last_heartbeat_at: datetime | None, now: datetime, heartbeat_interval_ms: int, session_timeout_ms: int
) -> tuple[float | None, Liveness]:
    """Seconds since the last heartbeat and what that means at a glance."""
    if last_heartbeat_at is None:
        return None, Liveness.UNKNOWN
    silent = max(0.0, (now - last_heartbeat_at).total_seconds())
    if silent * 1000 > session_timeout_ms:
        return silent, Liveness.EXPIRED
    if silent > late_after(heartbeat_interval_ms).total_seconds():
        return silent, Liveness.LATE
    return silent, Liveness.ALIVE
