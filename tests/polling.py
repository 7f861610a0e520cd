"""Waiting for a condition in tests: a poll with a deadline, never a blind sleep."""
from __future__ import annotations

import time
from collections.abc import Callable


def until(predicate: Callable[[], bool], what: str, seconds: float = 10) -> None:
    """Poll `predicate` every 5 ms until it is true; fail naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)
