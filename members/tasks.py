"""Celery tasks of the members app: thin wrappers over service functions (see groups.sweeps)."""
from __future__ import annotations

from typing import Any

from celery import shared_task

from groups import sweeps


@shared_task(name="members.tasks.sweep_liveness", ignore_result=True)
def sweep_liveness() -> dict[str, Any]:
    """L1 session expiry and L2 rebalance timeout over every group (beat, every tick)."""
    return sweeps.run_liveness_sweep()
