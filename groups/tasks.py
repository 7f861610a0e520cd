"""Celery tasks of the groups app: thin wrappers over service functions (see groups.sweeps)."""
from __future__ import annotations

from typing import Any

from celery import shared_task

from groups import sweeps


@shared_task(name="groups.tasks.advance_resharding", ignore_result=True)
def advance_resharding() -> dict[str, Any]:
    """§6: seal versions being resharded, retire drained ones (beat, every tick)."""
    return sweeps.run_resharding_sweep()


@shared_task(name="groups.tasks.apply_retention", ignore_result=True)
def apply_retention() -> dict[str, Any]:
    """Delete old member tombstones and events (beat, every RETENTION_INTERVAL_SECONDS)."""
    return sweeps.run_retention()
