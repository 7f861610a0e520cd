"""The one owner of this process's in-memory state (issue 23.1).

Every cache, memo, queue, gate and buffer a coordinator process keeps between requests is
created by the module that uses it and handed to `PROCESS` with `own()`, together with one
line that says its key, its bound, what invalidates it, and why it stays correct with N
coordinator hosts on one PostgreSQL. Nothing here is authoritative: the database is.

- `PROCESS.reset()` forgets everything (tests; a database rewind detected after a restore).
- `PROCESS.observe_generation(g)`: every read that decides from a cache also reads the
  installation's generation (raised by each `raise_epochs_after_restore`); another one than
  last seen means a restore, and `rewound()` drops everything without flushing (issue 23.3).
- `PROCESS.close()` flushes and closes what holds resources (worker exit: pending last-seen
  stamps written, Redis clients closed), then forgets the rest.
- `PROCESS.owned()` lists what is owned (the test that every entry is documented, the docs'
  table of per-process state).
- `PROCESS.start(cooperative=...)` runs once at each worker's start (gunicorn's
  post_worker_init, Celery's worker_process_init): it forgets whatever the process inherited
  (from the master before the fork, or filled at import), records whether the worker runs on
  gevent's cooperative threads, and lets each entry that decides something per worker decide
  it (`own(start=...)`: the shared group reads choose their coalescer). Until then (manage.py,
  tests) a process counts as not cooperative.

A module keeps a reference to what it owns for speed (a steady heartbeat reads several of
these per request); the owner only has to reach each of them.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

log = logging.getLogger(__name__)

# What each entry's one line must say (checked by tests/unit/test_process_state.py).
DOC_PARTS = ("key:", "bound:", "invalidated:", "N hosts:")


class ProcessCache(dict[K, V]):
    """A plain dict that the process state owns (reset() empties it). A subclass, so reads
    stay the C dict's own methods: the steady heartbeat path reads several per request."""

    def reset(self) -> None:
        self.clear()


@dataclass(frozen=True)
class Owned:
    name: str
    thing: Any
    doc: str
    reset: Callable[[], None]
    close: Callable[[], None]
    rewind: Callable[[], None]  # the database went back: drop (not flush) what it holds
    start: Callable[[ProcessState], None] | None  # decides what depends on the worker (start())


def _default(thing: Any, *names: str) -> Callable[[], None]:
    for name in names:
        method = getattr(thing, name, None)
        if callable(method):
            return method
    return lambda: None


class ProcessState:
    """This process's caches and buffers, each with its one-line contract."""

    def __init__(self) -> None:
        self._owned: dict[str, Owned] = {}
        self._lock = threading.Lock()
        # The installation generation this process's caches belong to (None: not read yet).
        self.generation: int | None = None
        self.rewinds = 0  # how many rewinds this process detected (tests, logs)
        # Set by start(): whether this worker runs on gevent's cooperative threads (gunicorn's
        # gevent worker), and which process started (None: not started as a worker).
        self.cooperative = False
        self.started_pid: int | None = None

    def own(
        self, name: str, thing: T, doc: str, *,
        reset: Callable[[], None] | None = None, close: Callable[[], None] | None = None,
        rewind: Callable[[], None] | None = None, start: Callable[[ProcessState], None] | None = None,
    ) -> T:
        """Take `thing` into the process state under `name` and return it. `reset` defaults to
        its reset() or clear(); `close` to its close(), else the reset; `rewind` to the reset.
        A module imported again (a test reloading it) replaces its earlier entry."""
        reset = reset or _default(thing, "reset", "clear")
        if close is None:
            close = _default(thing, "close") if callable(getattr(thing, "close", None)) else reset
        entry = Owned(name, thing, doc, reset, close, rewind or reset, start)
        with self._lock:
            self._owned[name] = entry
            started = self.started_pid is not None
        if started and start is not None:  # a module imported after the worker started
            start(self)
        return thing

    def start(self, *, cooperative: bool) -> None:
        """A worker process starts (gunicorn post_worker_init, Celery worker_process_init):
        forget what it inherited, then let each entry decide what depends on the worker."""
        self.reset()
        self.generation = None
        self.cooperative = cooperative
        self.started_pid = os.getpid()
        for entry in self.owned().values():
            if entry.start is not None:
                entry.start(self)

    def owned(self) -> dict[str, Owned]:
        with self._lock:
            return dict(self._owned)

    def reset(self) -> None:
        """Forget every cache (tests; a detected database rewind)."""
        for entry in self.owned().values():
            entry.reset()

    def observe_generation(self, generation: int) -> None:
        """The installation generation a read just returned (the steady path's group read, the
        locked pass's lock statement, a sweep, a routing read). Another one than this process
        last saw: the database was restored, and everything kept here may be of the abandoned
        history (epochs rewound and reached again with other contents): forget it all."""
        if generation == self.generation:
            return
        if self.generation is not None:
            self.rewound(f"installation generation {self.generation} -> {generation}")
        self.generation = generation

    def rewound(self, why: str) -> None:
        """The database went back (a restore): drop every cache and buffer, flush nothing."""
        with self._lock:
            self.rewinds += 1
        log.warning("database rewind detected (%s): this process's caches are dropped", why)
        for entry in self.owned().values():
            entry.rewind()

    def close(self) -> None:
        """Worker exit: flush and close in the reverse order of taking, then forget."""
        for entry in reversed(list(self.owned().values())):
            entry.close()


PROCESS = ProcessState()
