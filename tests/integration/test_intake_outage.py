"""Issue 8.1: a coordinator outage longer than the session timeout expires nobody.

A real gunicorn (the shipped config, whose workers stamp the intake beacon) is stopped for
more than two sessions while the liveness sweep keeps running; nobody expires. After it
is started again, members get one full session to be heard: the one that stays silent
expires only a session after the intake came back, the one that heartbeats stays.
"""
from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.utils import timezone

from groups.models import Event
from groups.sweeps import run_liveness_sweep
from members.models import IntakeBeacon
from members.models import Member as MemberRow
from tests import plain_http

from .conftest import make_group, running_gunicorn
from .test_resharding import Member

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]

SESSION_MS = 2_000
GAP_SECONDS = 1.0
SWEEP_TICK = 0.1  # the sweep service called like beat would, only more often
START_DEADLINE_S = 60.0  # servers started and members settled: a loaded machine takes longer


class HttpApi:
    """The APIClient.post signature the Member helper uses, over HTTP to a live server."""

    def __init__(self) -> None:
        self.base = ""

    def post(self, path: str, body: Any, format: str, HTTP_AUTHORIZATION: str) -> httpx.Response:
        return plain_http.post(self.base + path, json=body, headers={"Authorization": HTTP_AUTHORIZATION}, timeout=5)


def _up_since_after(moment: datetime) -> datetime | None:
    row = IntakeBeacon.objects.filter(up_since__gt=moment).values_list("up_since", flat=True).first()
    return row


def test_l1_gunicorn_stopped_past_the_session_while_sweeps_run_expires_nobody(
    settings: Any, tmp_path: Path
):
    settings.INTAKE_MAX_GAP_SECONDS = GAP_SECONDS
    env = {
        "INTAKE_BEACON_SECONDS": "0.2",
        "INTAKE_MAX_GAP_SECONDS": str(GAP_SECONDS),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus"),
    }
    fx = make_group(stream="outage", group="outage-g", shards=4,
                    session_timeout_ms=SESSION_MS, heartbeat_interval_ms=200)
    api = HttpApi()
    a, b = (Member(api, fx.group, fx.key, m) for m in ("a", "b"))  # type: ignore[arg-type]
    started = timezone.now()

    with running_gunicorn(**env) as server:
        api.base = server.url
        deadline = time.monotonic() + START_DEADLINE_S
        while not (all(len(m.owned) == 2 and m.last.get("status") == "OK" for m in (a, b))
                   and _up_since_after(started - timedelta(seconds=60))):
            assert time.monotonic() < deadline, (a.last, b.last)
            for m in (a, b):
                m.beat()
            time.sleep(0.1)  # heartbeat interval of the members
    stopped = timezone.now()

    # Outage: more than two sessions without any heartbeat while sweeps keep running.
    end = time.monotonic() + 2 * SESSION_MS / 1000 + GAP_SECONDS
    while time.monotonic() < end:
        result = run_liveness_sweep()
        assert result == {"expired": {}, "fenced": {}}
        time.sleep(SWEEP_TICK)
    assert set(MemberRow.objects.values_list("status", flat=True)) == {"STABLE"}

    with running_gunicorn(**env) as server:
        api.base = server.url
        deadline = time.monotonic() + START_DEADLINE_S
        while (back := _up_since_after(stopped)) is None:
            assert time.monotonic() < deadline, "the restarted workers never stamped the beacon"
            run_liveness_sweep()
            time.sleep(SWEEP_TICK)
        # b is heard again; a stays silent and expires a full session after the intake returned.
        # b beats from a thread of its own: the sweeps below (database work a loaded machine
        # slows down) never hold its heartbeats back past its session.
        stop_b, b_errors = threading.Event(), []

        def beat_b() -> None:
            while not stop_b.is_set():
                try:
                    b.beat()
                except Exception as exc:  # reported below, in the test's thread
                    b_errors.append(exc)
                stop_b.wait(0.1)  # heartbeat interval of the member

        beating = threading.Thread(target=beat_b, daemon=True)
        beating.start()
        try:
            deadline = time.monotonic() + 3 * SESSION_MS / 1000 + 5
            while MemberRow.objects.get(member_id="a").status != "EXPIRED":
                assert time.monotonic() < deadline, "a never expired after the intake came back"
                run_liveness_sweep()
                time.sleep(SWEEP_TICK)
        finally:
            stop_b.set()
            beating.join(10)
        assert not b_errors, b_errors[:3]
        assert MemberRow.objects.get(member_id="b").status != "EXPIRED"
    expired = Event.objects.get(kind="expired", member_id="a")
    assert expired.created_at >= back + timedelta(milliseconds=SESSION_MS)
    assert not Event.objects.filter(kind="expired", member_id="b").exists()
