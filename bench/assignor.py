"""Benchmark for coordination.assignor.assign().

Run ``.venv/bin/python bench/assignor.py`` from the repo root, or import ``run()``
(``from bench.assignor import run``) to get the figures as a dict of median milliseconds.

Cases, for 1,000 members x 10,000 shards and 10,000 members x 100,000 shards:
  cold  previous is empty (first assignment of a group), shard set never seen before;
  warm  previous is the assignment for one member fewer, i.e. one member joins; the shard
        set's natural order is already memoized, as in a running coordinator.
And ``join_core`` (issue 26.2), for 1,000 x 4,096 and 10,000 x 16,384: one join into a quiet,
settled group through ``coordination.engine.heartbeat`` on a snapshot that has served
joins before (as the coordinator's per-process snapshot has): the capacity check, the R1b
decision, the target recompute and the joiner's reconcile, without the database.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

SIZES = ((1_000, 10_000), (10_000, 100_000))
JOIN_SIZES = ((1_000, 4_096), (10_000, 16_384))


def _median_ms(call: Callable[[], object], runs: int) -> float:
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        timings.append((time.perf_counter() - start) * 1000)
    return statistics.median(timings)


def run(runs: int = 5) -> dict[str, float]:
    """Median wall time in ms of assign() per case, e.g. ``{"cold_1000x10000_ms": 11.9}``."""
    # Imported here so running the file as a script can put the repo root on sys.path first.
    from coordination import assignor
    from coordination.assignor import assign

    def cold(members: list[str], shards: list[str]) -> object:
        assignor._order_cache.clear()  # a shard set the coordinator has not sorted yet
        return assign(members, shards, {})

    results: dict[str, float] = {}
    for n_members, n_shards in SIZES:
        members = [f"consumer-{i}" for i in range(n_members)]
        # "stream:group:n" ids exercise the numeric part of the natural sort key.
        shards = [f"orders:{i // 1000}:{i % 1000}" for i in range(n_shards)]
        before_join = assign(members[:-1], shards, {})
        label = f"{n_members}x{n_shards}"
        results[f"cold_{label}_ms"] = _median_ms(partial(cold, members, shards), runs)
        results[f"warm_{label}_ms"] = _median_ms(
            partial(assign, members, shards, before_join), runs
        )
    results.update(run_join_core(runs=max(runs, 21)))
    return results


def run_join_core(runs: int = 21) -> dict[str, float]:
    """Median ms of one lone join into a settled group, in the core (see the module docstring)."""
    from datetime import UTC, datetime, timedelta

    from coordination import engine
    from coordination.assignor import assign
    from coordination.model import Changes, GroupState, HeartbeatRequest, Member, MemberStatus, ShardSlot

    results: dict[str, float] = {}
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for n_members, n_shards in JOIN_SIZES:
        slots = {f"orders:1:{i}": ShardSlot(shard_id=f"orders:1:{i}") for i in range(n_shards)}
        state = GroupState(name="g", stream="orders", shards=slots, max_members=n_members + runs + 10,
                           rebalance_window_ms=1000, rebalanced_at=t0)
        ids = [f"consumer-{i}" for i in range(n_members)]
        for mid in ids:
            state.members[mid] = Member(member_id=mid, status=MemberStatus.STABLE, member_epoch=1)
        for shard, mid in assign(ids, list(slots), {}).items():
            state.set_target(shard, mid)
            state.grant(shard, mid, 1)
        joins = iter(range(runs + 1))

        def join(state: GroupState = state, joins: Iterator[int] = joins) -> object:
            k = next(joins)
            state.changes = Changes()
            request = HeartbeatRequest(member_id=f"joiner-{k}", member_epoch=0)
            return engine.heartbeat(state, request, t0 + timedelta(seconds=10 * (k + 1)))

        join()  # the snapshot's first recompute (files the roster), as after a full load
        results[f"join_core_{n_members}x{n_shards}_ms"] = _median_ms(join, runs)
    return results


if __name__ == "__main__":
    # As a script, sys.path[0] is bench/; the package lives one level up.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    for name, ms in run().items():
        print(f"{name:28} {ms:8.3f}")
