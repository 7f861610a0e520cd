"""The heartbeat-intake beacon (issue 8.1): the shell around `engine.Intake`.

Every web worker runs `start_beacon()` (gunicorn's post_worker_init hook): a daemon thread —
a greenlet under the gevent worker, so it runs only while that worker's event loop does —
stamps the beacon row about once a second. The liveness sweep reads it with
`current_intake()` and hands it to L1/L2, which count only silence the coordinator could
have heard. Every member really dead still expires: the beacon does not depend on
heartbeats arriving, only on a worker being able to accept them and reach the database.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, IntegrityError, close_old_connections, connections, transaction
from django.db.models import Case, F, Value, When
from django.db.models.functions import Greatest
from django.utils import timezone

from coordination.engine import Intake
from members.models import IntakeBeacon

log = logging.getLogger(__name__)

HEARTBEAT_INTAKE = "heartbeat"
_started = threading.Event()


def _alias() -> str:
    # A lost stamp costs nothing: the no-fsync liveness connection where there is one.
    return "liveness" if "liveness" in connections.databases else "default"


def max_gap() -> timedelta:
    return timedelta(seconds=settings.INTAKE_MAX_GAP_SECONDS)


def stamp_beacon(now: datetime | None = None, node: str = "") -> None:
    """Record that this worker accepts heartbeats at `now`; after a gap, intake is back since now."""
    now = now or timezone.now()
    node = node or f"{socket.gethostname()}:{os.getpid()}"
    beacons = IntakeBeacon.objects.using(_alias()).filter(name=HEARTBEAT_INTAKE)
    # One statement, so concurrent workers never lose an up_since: every SET sees the old row.
    updated = beacons.update(
        up_since=Case(When(beat_at__lt=now - max_gap(), then=Value(now)), default=F("up_since")),
        beat_at=Greatest(F("beat_at"), Value(now)),
        node=node,
    )
    if not updated:
        try:
            with transaction.atomic(using=_alias()):
                IntakeBeacon.objects.using(_alias()).create(
                    name=HEARTBEAT_INTAKE, beat_at=now, up_since=now, node=node
                )
        except IntegrityError:
            stamp_beacon(now, node)  # another worker created it first


def current_intake() -> Intake:
    """The beacon as the core's `Intake` (unrecorded when no web worker ever stamped it)."""
    row = IntakeBeacon.objects.filter(name=HEARTBEAT_INTAKE).values_list("up_since", "beat_at").first()
    gap_ms = int(settings.INTAKE_MAX_GAP_SECONDS * 1000)
    if row is None:
        return Intake(max_gap_ms=gap_ms)
    return Intake(up_since=row[0], last_beacon=row[1], max_gap_ms=gap_ms)


def start_beacon() -> None:
    """Start this process's beacon thread once (idempotent)."""
    if _started.is_set():
        return
    _started.set()
    threading.Thread(target=_beacon_loop, name="intake-beacon", daemon=True).start()


def _beacon_loop() -> None:
    period = settings.INTAKE_BEACON_SECONDS
    stop = threading.Event()  # never set: a daemon thread ends with its worker
    failing = False
    while True:
        try:
            stamp_beacon()
            if failing:
                log.info("intake beacon stamped again")
            failing = False
        except DatabaseError as exc:
            if not failing:  # one line per outage, not one per second
                log.warning("intake beacon cannot reach the database: %s", exc)
            failing = True
        finally:
            # Hands a pooled connection back; drops a broken one so the next stamp reconnects.
            close_old_connections()
            if failing:
                connections[_alias()].close()
        stop.wait(period)
