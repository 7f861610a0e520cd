"""Bench-only: a steady heartbeat path without its freshness read, to measure what the read costs.

Loaded by bench/urls.py when RSC_BENCH_NO_FRESHNESS_READ is set (only `bench/heartbeat.py`
sets it, on a server of its own). Never in production: a worker patched this way answers
from the group row it read first, and misses every write another process makes after it.
"""
from __future__ import annotations

from assignments import fastpath


class _ReadOnce:
    """Each group's row read once per process (through the real coalesced read), then reused."""

    def __init__(self, reads: fastpath._GroupReads) -> None:
        self._reads = reads
        self._rows: dict[str, tuple | None] = {}

    def __getattr__(self, name: str) -> object:
        # Everything else (configure at worker start, cooperative, reset) is the real reads':
        # without this, PROCESS.start's configure failed on the wrapper and the reference ran
        # on a half-started worker (0.40x, slower than the safe path).
        return getattr(self._reads, name)

    def read(self, group: str) -> tuple | None:
        if group not in self._rows:
            self._rows[group] = self._reads.read(group)
        return self._rows[group]


def skip_freshness_read() -> None:
    fastpath._GROUP_READS = _ReadOnce(fastpath._GROUP_READS)  # type: ignore[assignment]
