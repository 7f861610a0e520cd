"""A lock per name, for work that one request per name and process should do at a time (a
group's locked pass, a group's member count, an API key's lookup). gevent patches threading,
so a waiter yields to the worker's other requests."""
from __future__ import annotations

import threading


class NamedLocks:
    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def __getitem__(self, name: str) -> threading.Lock:
        """The lock of `name`, made on first use."""
        with self._guard:
            lock = self._locks.get(name)
            if lock is None:
                lock = self._locks[name] = threading.Lock()
            return lock

    def discard(self, name: str) -> None:
        """Forget `name`'s lock (its current holders and waiters keep the one they have)."""
        with self._guard:
            self._locks.pop(name, None)

    def clear(self) -> None:
        """Forget every name's lock (tests; holders and waiters keep the ones they have)."""
        with self._guard:
            self._locks.clear()
