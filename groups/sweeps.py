"""The periodic work (PROTOCOL.md §5 L1–L3, §6), each job recording its last run in SweepRun.

Celery beat calls `run_liveness_sweep` and `run_resharding_sweep` (members.tasks,
groups.tasks); `manage.py sweep` calls `run_all_sweeps` for operators without Celery, cron
and tests. The jobs themselves are safe to run concurrently (row locks, compare-and-set),
so overlapping ticks or several workers only cost a few no-op queries.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.utils import timezone

from groups.models import SweepRun
from groups.namespace import observe_generation
from groups.resharding import advance_resharding
from groups.retention import apply_retention
from members.services import sweep_liveness

log = logging.getLogger(__name__)

LIVENESS = "liveness"  # L1 session expiry + L2 rebalance timeout
RESHARDING = "resharding"  # §6 seal / retire


def run_liveness_sweep(now: datetime | None = None) -> dict[str, Any]:
    def job(at: datetime) -> dict[str, Any]:
        result = sweep_liveness(at)
        return {"expired": result.expired, "fenced": result.fenced}

    return _recorded(LIVENESS, job, now)


def run_resharding_sweep(now: datetime | None = None) -> dict[str, Any]:
    return _recorded(RESHARDING, advance_resharding, now)


def run_retention(now: datetime | None = None) -> dict[str, Any]:
    """Not recorded in SweepRun: /readyz holds every recorded sweep to SWEEP_MAX_LAG_SECONDS,
    and retention runs far less often (RETENTION_INTERVAL_SECONDS)."""
    result = apply_retention(now)
    if any(result.values()):
        log.info("retention deleted %(tombstones)s member tombstones, %(events)s events", result,
                 extra={"event": "retention", **result})
    return dict(result)


def run_all_sweeps(now: datetime | None = None) -> dict[str, dict[str, Any]]:
    """One pass of every periodic job, in the order beat would run them."""
    return {LIVENESS: run_liveness_sweep(now), RESHARDING: run_resharding_sweep(now)}


def _recorded(name: str, job: Callable[[datetime], dict[str, Any]], now: datetime | None) -> dict[str, Any]:
    # Wall-clock stamps (not `now`, which tests may shift) so operators see the real lag.
    _stamp(name, last_started_at=timezone.now())
    observe_generation()  # after a restore, this worker's caches are dropped before it reads
    result = job(now or timezone.now())
    _stamp(name, last_finished_at=timezone.now(), last_result=result)
    return result


def _stamp(name: str, **values: Any) -> None:
    # An upsert: two first-ever runs at once must not collide on the unique name.
    SweepRun.objects.bulk_create(
        [SweepRun(name=name, **values)],
        update_conflicts=True,
        unique_fields=["name"],
        update_fields=list(values),
    )
