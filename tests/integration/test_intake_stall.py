"""Issue 27.3: a database stall that fails heartbeats is an intake outage for L1/L2.

Writing the beacon's own row is not answering heartbeats: a table lock on `groups_group`
failed every heartbeat while the beacon stamped on, and the sweep at unlock expired the
members that had retried all along. Now a failed probe of the heartbeat tables, or a
heartbeat the database failed, moves the intake's `up_since` to that moment.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from assignments.fastpath import STAMP_ALLOWANCE_S
from groups.sweeps import run_liveness_sweep
from members.intake import beat_once, current_intake, stamp_beacon
from members.models import IntakeBeacon
from members.models import Member as MemberRow
from members.services import sweep_liveness
from tests import plain_http

from .conftest import live_database_url, make_group, running_gunicorn
from .test_intake_outage import HttpApi
from .test_resharding import Member

pytestmark = [
    pytest.mark.needs_postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]


@contextmanager
def holder() -> Iterator[psycopg.Connection]:
    """Another session of the test's database, in a transaction the test ends."""
    with psycopg.connect(live_database_url().replace("postgres://", "postgresql://"), autocommit=False) as conn:
        try:
            yield conn
        finally:
            conn.rollback()


def test_i27_3_a_failed_heartbeat_moves_intake_back_since_to_the_failure(api: APIClient, settings: Any):
    """A heartbeat failed by the database (here: a group row lock past the statement timeout,
    which the table probe does not see) counts as intake outage until that moment."""
    fx = make_group(stream="stall", group="stall-g", session_timeout_ms=2_000, heartbeat_interval_ms=200)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {fx.key}"}
    beat_once()  # the intake is up before anyone is heard
    r = api.post(fx.url(), {"memberId": "a", "memberEpoch": 0}, format="json", **headers)
    assert r.status_code == 200, r.json()
    a_heard = MemberRow.objects.get(member_id="a").last_heartbeat_at
    assert a_heard is not None
    with holder() as other:
        other.execute("SELECT 1 FROM groups_group WHERE name = %s FOR UPDATE", (fx.group,))
        time.sleep(1.0)  # the stall lasts a while before the join below fails on it
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = 300")
        try:
            r = api.post(fx.url(), {"memberId": "b", "memberEpoch": 0}, format="json", **headers)
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET statement_timeout")
        assert r.status_code == 503, r.json()
    failed_by = timezone.now()
    assert not beat_once()  # the probe passes (a row lock): the failed heartbeat counts
    intake = current_intake()
    assert intake.up_since is not None
    assert a_heard + timedelta(seconds=1) < intake.up_since <= failed_by
    # Past a's session since it was last heard, within one since the failure: nobody expires.
    assert sweep_liveness(now=a_heard + timedelta(seconds=2.5)).count == 0
    # A session (and the stamp allowance) after the failure, the member that stayed silent
    # expires (L1 still works).
    past = timedelta(seconds=2.0 + STAMP_ALLOWANCE_S + 0.5)
    assert sweep_liveness(now=intake.up_since + past).expired == {fx.group: ["a"]}


def test_i27_3_up_since_never_moves_back_and_a_failure_after_the_last_stamp_counts(settings: Any):
    settings.INTAKE_MAX_GAP_SECONDS = 5
    t0 = timezone.now()
    stamp_beacon(t0)
    stamp_beacon(t0 + timedelta(seconds=1), failed_at=t0 + timedelta(seconds=0.5))
    assert IntakeBeacon.objects.get().up_since == t0 + timedelta(seconds=0.5)
    stamp_beacon(t0 + timedelta(seconds=2), failed_at=t0 + timedelta(seconds=0.2))  # another worker's older one
    assert IntakeBeacon.objects.get().up_since == t0 + timedelta(seconds=0.5)
    stamp_beacon(t0 + timedelta(seconds=3))
    assert IntakeBeacon.objects.get().up_since == t0 + timedelta(seconds=0.5)


def test_i27_3_readyz_answers_503_while_a_heartbeat_table_is_locked(api: APIClient, settings: Any):
    settings.INTAKE_PROBE_LOCK_TIMEOUT_MS = 300
    assert api.get("/readyz").status_code == 200
    with holder() as other:
        other.execute("LOCK TABLE groups_group IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        r = api.get("/readyz")
        elapsed = time.monotonic() - started
        assert r.status_code == 503, r.json()
        assert "heartbeat tables" in r.json()["checks"]["database"]
        assert elapsed < 3, f"took {elapsed:.1f} s"  # the probe's lock timeout, not a hang
    assert api.get("/readyz").status_code == 200


SESSION_MS = 2_000
MEMBERS = 4


def _body(m: Member) -> dict[str, Any]:
    return {"memberId": m.member_id, "memberEpoch": m.epoch, "metadataEpoch": m.metadata_epoch,
            "ownedShards": m.owned}


@pytest.mark.slow
def test_i27_3_a_table_lock_past_the_session_while_members_retry_expires_nobody(tmp_path: Path, settings: Any):
    """The issue's attack: `LOCK TABLE groups_group IN ACCESS EXCLUSIVE MODE` held for two and
    a half sessions while every member keeps retrying; at unlock the sweep expires nobody."""
    settings.INTAKE_MAX_GAP_SECONDS = 1.0
    env = {
        "INTAKE_BEACON_SECONDS": "0.2",
        "INTAKE_MAX_GAP_SECONDS": "1.0",
        "INTAKE_PROBE_LOCK_TIMEOUT_MS": "200",
        "DB_STATEMENT_TIMEOUT_MS": "1000",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus"),
    }
    fx = make_group(stream="tlock", group="tlock-g", shards=8, session_timeout_ms=SESSION_MS,
                    heartbeat_interval_ms=200)
    api = HttpApi()
    members = [Member(api, fx.group, fx.key, f"m{i}") for i in range(MEMBERS)]  # type: ignore[arg-type]
    started = timezone.now()
    with running_gunicorn(**env) as server:
        api.base = server.url
        deadline = time.monotonic() + 20
        while not (all(len(m.owned) == 2 and m.last.get("status") == "OK" for m in members)
                   and IntakeBeacon.objects.filter(up_since__gt=started - timedelta(seconds=60)).exists()):
            assert time.monotonic() < deadline, [m.last for m in members]
            for m in members:
                m.beat()
            time.sleep(0.1)  # heartbeat interval of the members

        statuses: list[int] = []
        with holder() as other:
            other.execute("LOCK TABLE groups_group IN ACCESS EXCLUSIVE MODE")
            end = time.monotonic() + 2.5 * SESSION_MS / 1000
            while time.monotonic() < end:  # every member retries all along
                for m in members:
                    try:
                        statuses.append(plain_http.post(
                            f"{server.url}/api/v1/groups/{fx.group}/heartbeat", json=_body(m),
                            headers={"Authorization": f"Bearer {fx.key}"}, timeout=5).status_code)
                    except httpx.TimeoutException:
                        statuses.append(0)
            assert 503 in statuses, statuses
            assert 200 not in statuses, statuses
            other.commit()  # unlock
        # The sweep right at unlock, before any member is heard again: nobody expires.
        result = run_liveness_sweep()
        assert result == {"expired": {}, "fenced": {}}
        # Members are heard again and sweeps go on for more than a session: still nobody.
        end = time.monotonic() + 1.5 * SESSION_MS / 1000
        while time.monotonic() < end:
            for m in members:
                m.beat()
            assert run_liveness_sweep() == {"expired": {}, "fenced": {}}
            time.sleep(0.1)  # heartbeat interval of the members
        assert set(MemberRow.objects.values_list("status", flat=True)) == {"STABLE"}
        # Every member really dead still expires: m0 stops, the others beat on.
        deadline = time.monotonic() + 3 * SESSION_MS / 1000 + 5
        while MemberRow.objects.get(member_id="m0").status != "EXPIRED":
            assert time.monotonic() < deadline, "a silent member never expired after the stall"
            for m in members[1:]:
                m.beat()
            run_liveness_sweep()
            time.sleep(0.1)  # heartbeat interval of the members


@pytest.mark.slow
def test_i27_3_a_heartbeat_dropped_at_its_request_deadline_counts_as_intake_outage(tmp_path: Path):
    """Under the shipped gevent workers a heartbeat stuck on the database is dropped at its
    request deadline (coordinator_project.wsgi_guard) before the statement timeout: that
    failure counts too (here a group row lock, which the table probe does not see)."""
    env = {
        "INTAKE_BEACON_SECONDS": "0.2",
        "REQUEST_DEADLINE_SECONDS": "1",
        "DB_STATEMENT_TIMEOUT_MS": "10000",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus"),
    }
    fx = make_group(stream="deadline", group="deadline-g")
    with running_gunicorn(**env) as server:
        deadline = time.monotonic() + 15
        while not IntakeBeacon.objects.exists():
            assert time.monotonic() < deadline, "the workers never stamped the beacon"
            time.sleep(0.1)  # poll interval of a deadline loop
        with holder() as other:
            other.execute("SELECT 1 FROM groups_group WHERE name = %s FOR UPDATE", (fx.group,))
            locked = timezone.now()
            r = plain_http.post(f"{server.url}{fx.url()}", json={"memberId": "a", "memberEpoch": 0},
                           headers={"Authorization": f"Bearer {fx.key}"}, timeout=15)
            answered = timezone.now()
            assert r.status_code == 503, r.text
            assert "dropped" in r.json()["errorMessage"], (answered - locked).total_seconds()
        deadline = time.monotonic() + 10
        while (up_since := IntakeBeacon.objects.get().up_since) <= locked:
            assert time.monotonic() < deadline, f"the dropped heartbeat never moved the intake's up_since ({up_since})"
            time.sleep(0.1)  # poll interval of a deadline loop
        assert up_since <= answered
