"""Liveness at a glance (alive / late / expired), the one classifier every view uses.

The matrix, the members admin (row label and list filter), describe, the dashboard and the
metrics all classify through here (queries through `cutoffs`), so "late" means the same
thing everywhere: silent for more than LATE_AFTER_INTERVALS heartbeat intervals; "expired":
silent beyond the session timeout (the next L1 sweep removes it). Pure: time enters as `now`.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

LATE_AFTER_INTERVALS = 2


class Liveness(StrEnum):
    ALIVE = "alive"
    LATE = "late"  # more than LATE_AFTER_INTERVALS heartbeat intervals silent
    EXPIRED = "expired"  # beyond the session timeout: the next sweep removes it (L1)
    UNKNOWN = "unknown"  # never heartbeated


# What the admin and the dashboard count as "late members": anything not plainly alive.
NEEDS_ATTENTION = frozenset({Liveness.LATE, Liveness.EXPIRED, Liveness.UNKNOWN})


def late_after(heartbeat_interval_ms: int) -> timedelta:
    return timedelta(milliseconds=LATE_AFTER_INTERVALS * heartbeat_interval_ms)


@dataclass(frozen=True)
class Cutoffs:
    """The rule as two instants for one group at `now`: a last heartbeat before
    `expired_before` is expired, one before `late_before` late. Queries compare the
    last-heartbeat column against these (members.selectors), so SQL and Python classify
    alike without restating the thresholds."""

    late_before: datetime
    expired_before: datetime

    def classify(self, last_heartbeat_at: datetime | None) -> Liveness:
        if last_heartbeat_at is None:
            return Liveness.UNKNOWN
        if last_heartbeat_at < self.expired_before:
            return Liveness.EXPIRED
        if last_heartbeat_at < self.late_before:
            return Liveness.LATE
        return Liveness.ALIVE


def cutoffs(now: datetime, heartbeat_interval_ms: int, session_timeout_ms: int) -> Cutoffs:
    return Cutoffs(
        late_before=now - late_after(heartbeat_interval_ms),
        expired_before=now - timedelta(milliseconds=session_timeout_ms),
    )


def liveness(
    last_heartbeat_at: datetime | None, now: datetime, heartbeat_interval_ms: int, session_timeout_ms: int
) -> tuple[float | None, Liveness]:
    """Seconds since the last heartbeat and what that means at a glance."""
    state = cutoffs(now, heartbeat_interval_ms, session_timeout_ms).classify(last_heartbeat_at)
    if last_heartbeat_at is None:
        return None, state
    return max(0.0, (now - last_heartbeat_at).total_seconds()), state
