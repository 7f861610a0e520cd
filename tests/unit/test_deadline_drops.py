"""Issue 27.4: a request dropped at its deadline (a BaseException raised where it waits) leaves
no shared state behind that other requests depend on: a key lookup it led, stamps it took."""
from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connections

from assignments import fastpath
from groups import services as keys


class _Dropped(BaseException):
    """Stands in for wsgi_guard.RequestDeadlineExceeded."""


def test_i27_4_waiters_of_a_key_lookup_whose_leader_was_dropped_look_up_again(monkeypatch: Any) -> None:
    joined = threading.Event()

    class _Done(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            joined.set()
            return super().wait(timeout)

    class _Flight(keys._KeyFlight):
        def __init__(self) -> None:
            super().__init__()
            self.done = _Done()

    lookups: list[str] = []

    def load_key(digest: str) -> Any:
        lookups.append(threading.current_thread().name)
        if len(lookups) == 1:
            assert joined.wait(10)  # a second request waits for this lookup
            raise _Dropped
        return "the scope"

    monkeypatch.setattr(keys, "_KeyFlight", _Flight)
    monkeypatch.setattr(keys, "_load_key", load_key)
    out: dict[str, object] = {}

    def send(name: str) -> None:
        try:
            out[name] = keys.resolve_api_key("rsc_dropped-leader-key")
        except _Dropped:
            out[name] = "dropped"
        except Exception as exc:  # recorded for the assertion
            out[name] = exc

    leader = threading.Thread(target=send, args=("leader",), name="leader")
    leader.start()
    waiter = threading.Thread(target=send, args=("waiter",), name="waiter")
    waiter.start()
    leader.join(10)
    waiter.join(10)
    assert out == {"leader": "dropped", "waiter": "the scope"}


def test_i27_4_stamps_taken_by_a_dropped_flush_go_with_the_next_batch(monkeypatch: Any) -> None:
    if "liveness" not in connections:
        pytest.skip("the stamp batch runs on PostgreSQL's liveness alias")
    stamps = fastpath._Stamps()
    now = datetime.now(UTC)
    stamps._pending = {1: (now, None, 3), 2: (now, '["s0"]', 3)}

    def cursor(*args: Any, **kwargs: Any) -> Any:
        raise _Dropped

    monkeypatch.setattr(connections["liveness"], "cursor", cursor)
    with pytest.raises(_Dropped):
        stamps.flush()
    assert stamps._pending == {1: (now, None, 3), 2: (now, '["s0"]', 3)}
