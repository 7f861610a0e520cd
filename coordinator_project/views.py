"""Health endpoints: /healthz does no I/O; /readyz checks what a heartbeat needs.

Readiness (HTTP 200 vs 503) depends on the database alone: a heartbeat needs nothing else.
Not only a connection: the table locks a heartbeat takes must be granted within
INTAKE_PROBE_LOCK_TIMEOUT_MS (issue 27.3: a `LOCK TABLE groups_group` failed every heartbeat
while `SELECT 1` answered), so a stalled table answers 503 within that time.
A database that lacks this release's migrations is not ready either (issue 24.3).
Redis (Celery broker, seal markers) and sweep lag are reported as `degraded` information
with status 200: a load balancer must not pull a working heartbeat API because Redis
blinked or beat stalled (members would then go unheard, which is what L1 punishes).
Alert on them from `degraded` or /metrics (`rsc_sweep_lag_seconds`) instead.
"""
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

from coordinator_project.migration_state import check_migrations
from coordinator_project.process_state import PROCESS
from groups.models import SweepRun
from members.intake import current_intake, probe_heartbeat_tables

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
    except Exception as exc:  # any failure means not ready
        checks["database"] = f"error: {exc.__class__.__name__}"
    if checks["database"] == "ok":
        try:
            checks["database"] = check_migrations()
        except Exception as exc:  # the migrations table unreadable: not ready either
            checks["database"] = f"error: cannot read the applied migrations ({exc.__class__.__name__})"
    if checks["database"] == "ok":
        try:
            probe_heartbeat_tables()
        except Exception as exc:  # any failure means heartbeats fail too
            checks["database"] = (f"error: heartbeat tables not lockable within "
                                  f"{settings.INTAKE_PROBE_LOCK_TIMEOUT_MS} ms ({exc.__class__.__name__})")
    checks["redis"] = _check_redis()
    if checks["database"] == "ok":
        checks.update(_check_sweeps())
        checks["intake"] = _check_intake()
    ready = checks["database"] == "ok"
    degraded = sorted(k for k, v in checks.items() if not (v == "ok" or v.startswith("ok ")))
    status = "unavailable" if not ready else ("degraded" if degraded else "ok")
    return JsonResponse({"status": status, "checks": checks, "degraded": degraded}, status=200 if ready else 503)


def _check_intake() -> str:
    """The heartbeat-intake beacon L1/L2 rely on (information: this worker is evidently up)."""
    intake = current_intake()
    if not intake.recorded:
        return "ok (no beacon recorded: not run by the shipped gunicorn config)"
    if not intake.up_at(timezone.now()):
        return f"stale: last beacon {intake.last_beacon:%Y-%m-%dT%H:%M:%SZ}"
    return f"ok (up since {intake.up_since:%Y-%m-%dT%H:%M:%SZ})"


# --- Redis and sweep lag -------------------------------------------------------------------
@cache
def _probe_client(url: str) -> redis.Redis:
    # One quick attempt: redis-py 8 retries with backoff by default, far too long for a probe.
    return redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))


PROCESS.own("readiness Redis clients", _probe_client, "key: REDIS_URL -> client; bound: one per URL; invalidated: never (a connection pool, no data); N hosts: holds no state.",
            reset=_probe_client.cache_clear)


def _check_redis() -> str:
    try:
        _probe_client(settings.REDIS_URL).ping()
        return "ok"
    except Exception as exc:  # any failure is reported
        return f"error: {exc.__class__.__name__} (heartbeats unaffected; sweeps and resharding wait for it)"


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
