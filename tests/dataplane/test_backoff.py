"""The one backoff helper (dataplane.backoff)."""

from __future__ import annotations

import logging
import threading

import pytest

from dataplane.backoff import Backoff, retry_call


def test_backoff_doubles_to_the_cap_and_resets() -> None:
    b = Backoff(200, 1000, jitter=False)
    assert [b.next() for _ in range(5)] == [200, 400, 800, 1000, 1000]
    assert b.failures == 5
    b.reset()
    assert b.next() == 200


def test_backoff_jitter_stays_between_half_and_full_delay() -> None:
    b = Backoff(0.1, 1.0)
    for expected in (0.1, 0.2, 0.4, 0.8, 1.0):
        assert expected / 2 <= b.next() <= expected


def test_retry_call_gives_up_after_attempts_and_reraises() -> None:
    calls: list[int] = []

    def fail() -> None:
        calls.append(1)
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        retry_call(fail, (ConnectionError,), Backoff(0.001, 0.001), log=logging.getLogger("t"),
                   what="test", attempts=3)  # fmt: skip
    assert len(calls) == 3


def test_retry_call_returns_once_it_succeeds_and_stops_on_stop() -> None:
    outcomes = iter([OSError("x"), OSError("y"), 42])

    def flaky() -> int:
        value = next(outcomes)
        if isinstance(value, Exception):
            raise value
        return value

    assert retry_call(flaky, (OSError,), Backoff(0.001, 0.001), log=logging.getLogger("t"),
                      what="test") == 42  # fmt: skip
    stop = threading.Event()
    stop.set()
    with pytest.raises(OSError, match=r"^z$"):
        retry_call(lambda: (_ for _ in ()).throw(OSError("z")), (OSError,), Backoff(1, 1),
                   log=logging.getLogger("t"), what="test", stop=stop)  # fmt: skip
