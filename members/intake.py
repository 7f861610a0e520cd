"""The heartbeat-intake beacon (issue 8.1): the shell around `engine.Intake`.

Every web worker runs `start_beacon()` (gunicorn's post_worker_init hook): a daemon thread —
a greenlet under the gevent worker, so it runs only while that worker's event loop does —
stamps the beacon row about once a second. The liveness sweep reads it with
`current_intake()` and hands it to L1/L2, which count only silence the coordinator could
have heard. Every member really dead still expires: the beacon does not depend on
heartbeats arriving, only on a worker being able to accept them and answer them.

Issue 27.3: being able to write the beacon's own row is not being able to answer heartbeats
(a lock on `groups_group` held for 45 s failed every heartbeat while the beacon stamped on,
and the sweep then expired the members that had retried all along). So the intake counts as
down — `up_since` moves to the failure — whenever, since the last stamp,
- a heartbeat of this worker failed because of the database (`note_heartbeat_failed`, from
  the heartbeat view: its 503, or its request deadline dropping it while it waited), or
- the beacon's probe could not take, within `INTAKE_PROBE_LOCK_TIMEOUT_MS`, the table locks
  a heartbeat takes (`probe_heartbeat_tables`, also what /readyz checks).
L1/L2 then count silence only from after the last such failure: after the stall, every member
gets one full session (and revoking ones a full rebalance timeout) to be heard again.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, IntegrityError, close_old_connections, connections, transaction
from django.db.models import Case, F, Model, Value, When
from django.db.models.functions import Greatest
from django.utils import timezone

from assignments.models import ShardAssignment
from coordination.engine import Intake
from coordinator_project.process_state import PROCESS
from groups.models import ApiKey, Event, Group, Shard, ShardVersion, Stream
from members.models import IntakeBeacon, Member

log = logging.getLogger(__name__)

HEARTBEAT_INTAKE = "heartbeat"
_started = threading.Event()

# The tables a heartbeat writes (row locks, inserts: ROW EXCLUSIVE) and only reads (ACCESS
# SHARE). A lock that would block a heartbeat on any of them makes the probe fail.
_WRITTEN: tuple[type[Model], ...] = (Group, Member, ShardAssignment, Event, ApiKey)
_READ: tuple[type[Model], ...] = (Stream, ShardVersion, Shard)


class _Failures:
    """The latest database failure of a heartbeat in this process not yet stamped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: datetime | None = None

    def note(self, at: datetime) -> None:
        with self._lock:
            if self._at is None or at > self._at:
                self._at = at

    def peek(self) -> datetime | None:
        with self._lock:
            return self._at

    def stamped(self, at: datetime) -> None:
        """The beacon recorded failures up to `at`: forget them (not a later one)."""
        with self._lock:
            if self._at is not None and self._at <= at:
                self._at = None

    def reset(self) -> None:
        with self._lock:
            self._at = None


_failures = PROCESS.own(
    "unstamped heartbeat failures", _Failures(),
    "key: none, the latest moment a heartbeat failed by the database or the table probe failed;"
    " bound: one datetime; invalidated: the next beacon stamp writes it; N hosts: the stamp takes"
    " the greatest moment of any worker in one statement, so no worker's note is lost.",
)


def note_heartbeat_failed(now: datetime | None = None) -> None:
    """A heartbeat could not be answered because of the database: the intake was down then."""
    _failures.note(now or timezone.now())


def _alias() -> str:
    # A lost stamp costs nothing: the no-fsync liveness connection where there is one.
    return "liveness" if "liveness" in connections.databases else "default"


def max_gap() -> timedelta:
    return timedelta(seconds=settings.INTAKE_MAX_GAP_SECONDS)


def stamp_beacon(now: datetime | None = None, node: str = "", failed_at: datetime | None = None) -> None:
    """Record that this worker accepts heartbeats at `now`; after a gap, intake is back since now.

    `failed_at`: the latest moment since the last stamp at which this worker could not answer
    a heartbeat (issue 27.3); the intake is back only since then (`up_since` never moves back).
    """
    now = now or timezone.now()
    node = node or f"{socket.gethostname()}:{os.getpid()}"
    beacons = IntakeBeacon.objects.using(_alias()).filter(name=HEARTBEAT_INTAKE)
    back_since = now if failed_at is None else min(failed_at, now)
    # One statement, so concurrent workers never lose an up_since: every SET sees the old row.
    kept = F("up_since") if failed_at is None else Greatest(F("up_since"), Value(back_since))
    updated = beacons.update(
        up_since=Case(When(beat_at__lt=now - max_gap(), then=Value(now)), default=kept),
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
            stamp_beacon(now, node, failed_at)  # another worker created it first


def probe_heartbeat_tables(alias: str | None = None, lock_timeout_ms: int | None = None) -> None:
    """Take, and give back at once, the table locks a heartbeat needs; raise DatabaseError
    (OperationalError: lock timeout) if they are not granted within `lock_timeout_ms`.

    A table-wide stall (`LOCK TABLE`, a migration queued behind a long transaction, a
    non-concurrent index build) fails every heartbeat while a plain `SELECT 1` or the beacon's
    own write succeeds. The locks are table-level only (no row is touched) and of the modes a
    heartbeat itself takes, so the probe never waits for, or blocks, a heartbeat.
    """
    alias = alias or _alias()
    timeout = settings.INTAKE_PROBE_LOCK_TIMEOUT_MS if lock_timeout_ms is None else lock_timeout_ms
    conn = connections[alias]
    if conn.vendor != "postgresql":
        return  # SQLite locks the whole file: the heartbeat's own write is the probe
    qn = conn.ops.quote_name
    with transaction.atomic(using=alias), conn.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = {int(timeout)}")
        cursor.execute("LOCK TABLE {} IN ROW EXCLUSIVE MODE".format(
            ", ".join(qn(m._meta.db_table) for m in _WRITTEN)))
        cursor.execute("LOCK TABLE {} IN ACCESS SHARE MODE".format(
            ", ".join(qn(m._meta.db_table) for m in _READ)))


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


def beat_once(now: datetime | None = None) -> bool:
    """One beacon tick: probe the heartbeat tables, then stamp, with this process's heartbeat
    failures (and a failed probe) as of when the intake was last down. Returns whether the
    probe failed; raises DatabaseError when the stamp itself cannot be written."""
    try:
        probe_heartbeat_tables()
        blocked = False
    except DatabaseError as exc:
        blocked = True
        log.debug("intake probe failed: %s", exc)
        note_heartbeat_failed(now)
    failed_at = _failures.peek()
    stamp_beacon(now, failed_at=failed_at)
    if failed_at is not None:
        _failures.stamped(failed_at)
    return blocked


def _beacon_loop() -> None:
    period = settings.INTAKE_BEACON_SECONDS
    stop = threading.Event()  # never set: a daemon thread ends with its worker
    failing = blocked = False
    while True:
        try:
            now_blocked = beat_once()
            if now_blocked != blocked:  # one line per stall, not one per second
                if now_blocked:
                    log.warning("intake probe: the heartbeat tables cannot be locked within %s ms; "
                                "counted as an intake outage", settings.INTAKE_PROBE_LOCK_TIMEOUT_MS)
                else:
                    log.info("intake probe: the heartbeat tables can be locked again")
            blocked = now_blocked
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
