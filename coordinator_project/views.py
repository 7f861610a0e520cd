"""Health endpoints: /healthz does no I/O; /readyz checks what a heartbeat needs. And /favicon.ico."""
from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import redis
from django.conf import settings
from django.db import connection
from django.http import FileResponse, HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_safe
from redis.backoff import NoBackoff
from redis.retry import Retry

from groups.models import SweepRun

FAVICON = Path(__file__).with_name("static") / "favicon.ico"


def healthz(request: HttpRequest) -> JsonResponse:
    body = {"status": "ok"}
    # `make run` (scripts/run.py) sets a per-run id, so its readiness check can tell the
    # server it started from one left over on the same port.
    run_id = os.environ.get("RSC_RUN_ID")
    if run_id:
        body["runId"] = run_id
    return JsonResponse(body)


@require_safe
@cache_control(max_age=86400, public=True)
def favicon(request: HttpRequest) -> FileResponse:
    """Browsers ask every page's host for /favicon.ico; without it each admin page logs a 404."""
    return FileResponse(FAVICON.open("rb"), content_type="image/x-icon")


def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        checks["database"] = f"error: {exc.__class__.__name__}"
    checks["redis"] = _check_redis()
    if checks["database"] == "ok":
        checks.update(_check_sweeps())
    ready = all(v == "ok" or v.startswith("ok ") for v in checks.values())
    return JsonResponse({"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503)


# --- issue 5: Redis and sweep lag ------------------------------------------------------------
@cache
def _probe_client(url: str) -> redis.Redis:
    # One quick attempt: redis-py 8 retries with backoff by default, far too long for a probe.
    return redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))


def _check_redis() -> str:
    try:
        _probe_client(settings.REDIS_URL).ping()
        return "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        return f"error: {exc.__class__.__name__}"


def _check_sweeps() -> dict[str, str]:
    """Every recorded sweep must have finished within SWEEP_MAX_LAG_SECONDS (L1/L2 need it).

    No record yet (a fresh install before beat's first tick) is not an error.
    """
    limit = settings.SWEEP_MAX_LAG_SECONDS
    now = timezone.now()
    checks = {}
    for run in SweepRun.objects.order_by("name"):
        key = f"sweep:{run.name}"
        if run.last_finished_at is None:
            checks[key] = "ok (never finished yet)"
            continue
        lag = (now - run.last_finished_at).total_seconds()
        checks[key] = "ok" if lag <= limit else f"lagging: last finished {lag:.0f} s ago (limit {limit:.0f} s)"
    return checks
