"""L1 and §6 driven by a real Celery worker running the project's beat schedule (Redis broker)."""
from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
import redis
from django.conf import settings
from rest_framework.test import APIClient

from assignments.fastpath import STAMP_ALLOWANCE_S
from coordinator_project.celery import app as project_app
from dataplane.routing import ShardKeys
from groups.models import Event, Stream, SweepRun
from groups.namespace import default_key_prefix
from groups.resharding import start_reshard
from groups.services import create_stream
from members.models import Member as MemberRow

from .conftest import make_group
from .test_resharding import Member

if TYPE_CHECKING:
    from .conftest_celery import CeleryRig

pytest_plugins = ["tests.integration.conftest_celery"]
pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]

SESSION_MS = 1500
HEARTBEAT_MS = 100


def test_l3_beat_schedule_names_registered_tasks():
    project_app.loader.import_default_modules()
    schedule = project_app.conf.beat_schedule
    assert {e["task"] for e in schedule.values()} == {
        "members.tasks.sweep_liveness", "groups.tasks.advance_resharding", "groups.tasks.apply_retention"}
    assert all(e["task"] in project_app.tasks for e in schedule.values())
    assert all(e["schedule"] == settings.SWEEP_INTERVAL_SECONDS
               for name, e in schedule.items() if name != "apply-retention")
    assert schedule["apply-retention"]["schedule"] == settings.RETENTION_INTERVAL_SECONDS


def test_l1_beat_expires_a_silent_member_and_its_shards_move_within_session_timeout_plus_a_tick(
    api: APIClient, celery_beat_worker: CeleryRig
):
    fx = make_group(stream="cel", group="cel-g", shards=6,
                    session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS)
    a, b, c = (Member(api, fx.group, fx.key, m) for m in ("a", "b", "c"))
    everyone = [a, b, c]
    deadline = time.monotonic() + 10
    while not all(m.last.get("status") == "OK" and len(m.owned) == 2 for m in everyone):
        assert time.monotonic() < deadline, [m.last for m in everyone]
        for m in everyone:
            m.beat()
        time.sleep(HEARTBEAT_MS / 1000)
    a_shards = set(a.owned)

    # a goes silent; b and c keep heartbeating at their interval.
    last_seen = MemberRow.objects.get(member_id="a").last_heartbeat_at
    # L1 counts silence from fastpath.STAMP_ALLOWANCE_S later (batched stamps may be on their way).
    bound = (timedelta(milliseconds=SESSION_MS) + timedelta(seconds=celery_beat_worker.tick)
             + timedelta(seconds=STAMP_ALLOWANCE_S))
    deadline = time.monotonic() + (bound.total_seconds() + 5)
    all_shards = {f"cel:1:{i}" for i in range(6)}
    while set(b.owned) | set(c.owned) != all_shards:
        assert time.monotonic() < deadline, "a's shards never moved"
        for m in (b, c):
            m.beat()
            # R9: never two owners; a's shards move only after a was expired.
            assert not set(b.owned) & set(c.owned)
            if (set(b.owned) | set(c.owned)) & a_shards:
                assert MemberRow.objects.get(member_id="a").status == "EXPIRED"
        time.sleep(HEARTBEAT_MS / 1000)

    expired = Event.objects.get(kind="expired", member_id="a")
    assert expired.actor == "sweeper"
    # Expired within session timeout + one tick (+ a little for the task's own latency).
    assert expired.created_at - last_seen <= bound + timedelta(milliseconds=500)
    # The handover completed within that plus one heartbeat of the survivors (+ slack).
    handed = max(e.created_at for e in Event.objects.filter(kind="rebalanced"))
    assert handed - last_seen <= bound + timedelta(milliseconds=HEARTBEAT_MS + 500)
    # L1: the silent member's next heartbeat is told it is no longer in the group.
    r = api.post(f"/api/v1/groups/{fx.group}/heartbeat",
                 {"memberId": "a", "memberEpoch": a.epoch, "metadataEpoch": 1, "ownedShards": a.owned},
                 format="json", HTTP_AUTHORIZATION=f"Bearer {fx.key}")
    assert r.status_code == 409
    assert r.json()["errorCode"] == "UNKNOWN_MEMBER_ID"
    run = SweepRun.objects.get(name="liveness")
    assert run.last_finished_at is not None
    assert run.last_finished_at >= expired.created_at - timedelta(seconds=1)


def test_s6_beat_advances_a_reshard_to_stable(celery_beat_worker: CeleryRig, stream_redis: redis.Redis):
    create_stream("rs-cel", 2)
    start_reshard("rs-cel", 3)
    deadline = time.monotonic() + 10
    while Stream.objects.get(name="rs-cel").state != "STABLE":
        assert time.monotonic() < deadline, Stream.objects.get(name="rs-cel").state
        time.sleep(0.05)
    kinds = list(Event.objects.filter(stream__name="rs-cel").order_by("id").values_list("kind", flat=True))
    assert kinds == ["reshard_started", "reshard_sealing", "version_sealed", "version_retired"]
    assert stream_redis.exists(*(ShardKeys(f"rs-cel:1:{i}", default_key_prefix()).sealed for i in range(2))) == 2
    # Later ticks find nothing to do, and say so in SweepRun (lag and result visible).
    while SweepRun.objects.get(name="resharding").last_result != {}:
        assert time.monotonic() < deadline
        time.sleep(0.05)
