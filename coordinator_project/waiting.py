"""The one way a request waits for another request of its process (issue 23.6).

A gevent worker serves many requests at once from small per-process connection pools (two
"default" connections, four "liveness"; settings.DB_POOL). A request that keeps a pooled
connection while it waits for something another request does (a group's gate, a shared read
of the group row, an API key lookup, a member count) can starve the very request it waits
for: in a join storm, requests that kept their "liveness" connection queued for the gate,
while the gate's holder waited for a "default" connection held by requests waiting for
"liveness", and the worker stalled until the pools' 15 s timeouts (decision 0004). So nobody
waits while holding a connection: every such wait goes through `acquire`, `held` or `wait`,
which hand back this request's connections first, and only when they are about to block (the
uncontended case costs nothing). tests/unit/test_waiting.py fails on any other `.wait()` or
`.acquire()` in the coordinator's request code, and on a `with` over a NamedLocks entry.

A connection inside a transaction is kept: its work is not done. Waiting inside a transaction
is therefore a bug the caller must avoid (the group gate is taken before the transaction).
Background threads (the stamp batcher, the intake beacon) wait on their own timers and hold
no request's connection; they are not requests and do not use this module.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from coordinator_project import dbpool


class _Lock(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...
    def release(self) -> None: ...


def acquire(lock: _Lock, *, blocking: bool = True) -> bool:
    """Take `lock`; before blocking on it, hand back this request's connections. With
    `blocking` off, False at once when it is taken."""
    if lock.acquire(False):
        return True
    if not blocking:
        return False
    dbpool.hand_back_before_waiting()
    return lock.acquire()


@contextmanager
def held(lock: _Lock) -> Iterator[None]:
    """`with held(lock):` is `with lock:` through `acquire`."""
    acquire(lock)
    try:
        yield
    finally:
        lock.release()


def wait(event: threading.Event, timeout: float | None = None) -> bool:
    """Wait until `event` is set (or `timeout` seconds passed: False); before blocking, hand
    back this request's connections."""
    if event.is_set():
        return True
    dbpool.hand_back_before_waiting()
    return event.wait() if timeout is None else event.wait(timeout)
