"""The one retry backoff of the data plane: exponential, capped, optionally jittered.

The runtime (Redis commands, ACKs, the reader, handler retries), the transport (HTTP
attempts), the membership machine (heartbeat retries, on its own ``now_ms`` clock) and the
producer (waiting out a reshard) all count failures with a :class:`Backoff`, so they grow and
cap their delays the same way.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class Backoff:
    """``base * 2**(failures-1)`` capped at ``cap`` (any unit: seconds or milliseconds);
    with ``jitter`` a delay is drawn from [d/2, d] so that many members do not retry in step."""

    base: float
    cap: float
    jitter: bool = True
    failures: int = 0

    def next(self) -> float:
        """Count one more failure and return the delay before the next attempt."""
        self.failures += 1
        delay = min(self.cap, self.base * 2 ** (self.failures - 1))
        # Jitter spreads retries; it needs no cryptographic randomness.
        return delay * (0.5 + random.random() / 2) if self.jitter else delay  # noqa: S311

    def reset(self) -> None:
        self.failures = 0

    def wait(self, stop: threading.Event | None = None) -> bool:
        """Sleep the next delay (in seconds); True when ``stop`` was set meanwhile."""
        delay = self.next()
        if stop is None:
            time.sleep(delay)
            return False
        return stop.wait(delay)


def retry_call(
    fn: Callable[[], T],
    retry_on: tuple[type[BaseException], ...],
    backoff: Backoff,
    *,
    log: logging.Logger,
    what: str,
    stop: threading.Event | None = None,
    attempts: int = 0,
) -> T:
    """Call ``fn`` until it does not raise one of ``retry_on``. Gives up (re-raising) after
    ``attempts`` calls (0: never) or once ``stop`` is set."""
    while True:
        try:
            return fn()
        except retry_on as exc:
            last_try = attempts and backoff.failures + 1 >= attempts
            if last_try or (stop is not None and stop.is_set()):
                raise
            log.warning("%s failed (retrying): %r", what, exc)
            if backoff.wait(stop):
                raise
