"""Each group's gate in this process: one locked pass per group and process at a time."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from coordinator_project import waiting
from coordinator_project.named_locks import NamedLocks
from coordinator_project.process_state import PROCESS

# One locked pass per group at a time in each process. Without it, when a pass commits, the
# next waiter on the group's row lock may be another request of the same worker that wakes
# before the committing one has put the snapshot back (gevent runs either first): it finds no
# snapshot and loads the whole group (~20 ms for 1,000 × 4,096). In a join storm that was one
# locked pass in six. Waiting here is cooperative (gevent patches threading) and costs
# nothing the row lock would not: the passes of a group run one at a time anyway.
_gates = PROCESS.own(
    "group gates", NamedLocks(),
    "One locked pass per group and process. key: group name -> lock; bound: one per group this"
    " process served; invalidated: never (a lock holds no data); N hosts: the group's row lock"
    " orders passes across processes, this only orders them within one.",
)


@contextmanager
def group_gate(name: str, *, wait: bool = True) -> Iterator[bool]:
    """Hold this process's gate of group `name` for a locked pass (load → core → save →
    commit → snapshot back). Yields False, without waiting, when `wait` is off and the gate
    is taken. Call it outside any transaction: before waiting it hands this request's
    database connections back (to the pools under gevent), since the holder may need one."""
    gate = _gates[name]
    # A waiter holding pooled connections would starve the holder of one (a deadlock until
    # the pool's timeout): `waiting.acquire` hands them back before it blocks.
    if not waiting.acquire(gate, blocking=wait):
        yield False
        return
    try:
        yield True
    finally:
        gate.release()
