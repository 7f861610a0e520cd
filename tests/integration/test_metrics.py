"""/metrics, /readyz and the JSON log lines, against PostgreSQL and Redis.

The multi-worker test runs gunicorn with coordinator_project/gunicorn_conf.py (2 workers,
prometheus_client multiprocess mode) and checks that every scrape, whichever worker
answers it, reports the heartbeats of all workers.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from coordinator_project.logging import JsonFormatter
from groups.models import SweepRun
from groups.sweeps import run_all_sweeps
from members.services import fence_member
from tests import plain_http
from tests.ports import refused_port

from .conftest import GroupFixture, Hb, make_group, running_gunicorn

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    """The sum over the series of `name` that carry these labels (others, e.g. path, summed)."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def metrics(client: Client) -> dict:
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/plain")
    return scrape(r.content.decode())


def test_metrics_move_when_heartbeats_arrive(hb: Hb, orders: GroupFixture):
    c = Client()
    before = metrics(c)
    ok = value(before, "rsc_heartbeats_total", error_code="NONE", status="OK")
    fenced = value(before, "rsc_heartbeats_total", error_code="FENCED_MEMBER_EPOCH", status="")
    seen = value(before, "rsc_heartbeat_latency_seconds_count")

    _, a = hb({"memberId": "a", "memberEpoch": 0})
    _s, _b = hb({"memberId": "b", "memberEpoch": 0})
    hb({"memberId": "a", "memberEpoch": 1})  # wrong epoch: FENCED_MEMBER_EPOCH
    hb({"memberId": "a", "memberEpoch": a["memberEpoch"], "metadataEpoch": 1,
        "ownedShards": a["assignment"]["assignedShards"]})  # REVOKE_PENDING
    hb("{", raw=True)  # INVALID_REQUEST
    hb({"memberId": "a", "memberEpoch": 0}, key="rsc_wrong")  # AUTHENTICATION_FAILED

    after = metrics(c)
    assert value(after, "rsc_heartbeats_total", error_code="NONE", status="OK") == ok + 2
    assert value(after, "rsc_heartbeats_total", error_code="NONE", status="REVOKE_PENDING") >= 1
    assert value(after, "rsc_heartbeats_total", error_code="FENCED_MEMBER_EPOCH", status="") == fenced + 1
    assert value(after, "rsc_heartbeats_total", error_code="INVALID_REQUEST", status="") >= 1
    assert value(after, "rsc_heartbeats_total", error_code="AUTHENTICATION_FAILED", status="") >= 1
    assert value(after, "rsc_heartbeat_latency_seconds_count") == seen + 6
    assert value(after, "rsc_heartbeat_latency_seconds_bucket", le="+Inf") >= seen + 6

    # State at scrape time: a holds 2 revoking, b waits for them.
    assert value(after, "rsc_group_members", group="g1", state="REVOKING") == 1
    assert value(after, "rsc_group_members", group="g1", state="PENDING") == 1
    assert value(after, "rsc_group_members", group="g1", state="FENCED") == 0
    assert value(after, "rsc_group_shards", group="g1", state="granted") == 2
    assert value(after, "rsc_group_shards", group="g1", state="revoking") == 2
    assert value(after, "rsc_group_pending_shards", group="g1") == 2
    assert value(after, "rsc_group_epoch", group="g1") == 3
    assert value(after, "rsc_stream_resharding_state", stream="orders", state="STABLE") == 1
    assert value(after, "rsc_stream_resharding_state", stream="orders", state="DRAINING") == 0
    assert value(after, "rsc_stream_versions", stream="orders", state="ACTIVE") == 1

    fence_member("g1", "a", actor="test")
    after = metrics(c)
    assert value(after, "rsc_group_members", group="g1", state="FENCED") == 1
    assert value(after, "rsc_group_shards", group="g1", state="unowned") == 4
    assert value(after, "rsc_group_pending_shards", group="g1") == 4


def test_heartbeat_counts_are_folded_in_as_observe_would_write_them(db: None):
    """Heartbeats are tallied in the process and folded into the counters in one step per
    label set and bucket (by a timer within FOLD_PERIOD_S, or before a scrape): the series
    come out exactly as one inc() and one observe() per heartbeat would have made them."""
    from prometheus_client import CollectorRegistry, Histogram

    from coordinator_project import metrics as m

    m.fold_heartbeat_tally()
    client = Client()
    before = metrics(client)
    reference = Histogram("reference_latency_seconds", "", buckets=m._LATENCY_BUCKETS,
                          registry=CollectorRegistry())
    latencies = [0.0004, 0.001, 0.003, 0.003, 0.2, 7.0]
    for seconds in latencies:
        m.record_heartbeat("g", {}, {"errorCode": "NONE", "status": "OK"}, seconds, "fast")
        reference.observe(seconds)
    after = metrics(client)  # the scrape folds the tally first
    assert value(after, "rsc_heartbeats_total", error_code="NONE", status="OK", path="fast") == value(
        before, "rsc_heartbeats_total", error_code="NONE", status="OK", path="fast") + len(latencies)
    expected = {dict(s.labels)["le"]: s.value for s in reference.collect()[0].samples if s.name.endswith("_bucket")}
    for le, n in expected.items():
        assert value(after, "rsc_heartbeat_latency_seconds_bucket", le=le) == value(
            before, "rsc_heartbeat_latency_seconds_bucket", le=le) + n, le
    assert value(after, "rsc_heartbeat_latency_seconds_sum") == pytest.approx(
        value(before, "rsc_heartbeat_latency_seconds_sum") + sum(latencies))
    # Without a scrape, the timer folds them in.
    m.record_heartbeat("g", {}, {"errorCode": "NONE", "status": "OK"}, 0.002, "fast")
    counter = m.HEARTBEATS.labels("NONE", "OK", "fast")
    deadline = time.monotonic() + 5
    while counter._value.get() < value(after, "rsc_heartbeats_total", error_code="NONE", status="OK", path="fast") + 1:
        assert time.monotonic() < deadline, "the tally was never folded in"
        time.sleep(0.01)


def test_metrics_show_sweep_lag_and_resharding(orders: GroupFixture):
    from groups.resharding import start_reshard

    run_all_sweeps()
    samples = metrics(Client())
    assert 0 <= value(samples, "rsc_sweep_lag_seconds", sweep="liveness") < 60
    assert ("rsc_sweep_lag_seconds", (("sweep", "resharding"),)) in samples
    start_reshard("orders", 8, actor="test")
    samples = metrics(Client())
    assert value(samples, "rsc_stream_resharding_state", stream="orders", state="PREPARING") == 1
    assert value(samples, "rsc_stream_write_version", stream="orders") == 2
    assert value(samples, "rsc_stream_versions", stream="orders", state="ACTIVE") == 2


@override_settings(METRICS_TOKEN="s3cret")
def test_metrics_token_when_configured(db: None):
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


@override_settings(METRICS_TOKEN="s3cret")
def test_i27_10_metrics_token_with_a_non_ascii_authorization_header_is_401_not_500(db: None):
    # WSGI hands header bytes over as latin-1 text: "é" sent as UTF-8 arrives as "Ã©".
    for sent in ("Bearer s3crét", "Bearer s3cr\u00c3\u00a9t", "Bearer \u00ff" * 3):
        r = Client(raise_request_exception=False).get("/metrics", HTTP_AUTHORIZATION=sent)
        assert r.status_code == 401, sent


# --- /readyz ---------------------------------------------------------------------------------------
def test_readyz_checks_database_redis_and_sweep_lag(db: None):
    c = Client()
    r = c.get("/readyz")
    assert r.status_code == 200
    assert r.json()["status"] == "ok"
    assert r.json()["degraded"] == []
    assert r.json()["checks"]["database"] == "ok"
    assert r.json()["checks"]["redis"] == "ok"
    run_all_sweeps()
    r = c.get("/readyz")
    assert r.status_code == 200
    assert r.json()["checks"]["sweep:liveness"] == "ok"
    assert r.json()["checks"]["sweep:resharding"] == "ok"
    # A stalled beat: the last liveness sweep finished long ago (the row as a stalled sweep leaves it).
    # Reported, but the web tier stays ready: heartbeats still work (issue 8.4).
    SweepRun.objects.filter(name="liveness").update(last_finished_at=timezone.now() - timedelta(minutes=5))
    r = c.get("/readyz")
    assert r.status_code == 200
    assert r.json()["status"] == "degraded"
    assert r.json()["degraded"] == ["sweep:liveness"]
    assert r.json()["checks"]["sweep:liveness"].startswith("lagging: last finished 300 s ago")


def test_readyz_redis_outage_is_degraded_not_unready(db: None):
    with refused_port() as port, override_settings(REDIS_URL=f"redis://127.0.0.1:{port}/0"):
        started = time.monotonic()
        r = Client().get("/readyz")
    assert r.status_code == 200
    assert r.json()["status"] == "degraded"
    assert r.json()["degraded"] == ["redis"]
    assert r.json()["checks"]["redis"].startswith("error: ConnectionError (heartbeats unaffected")
    assert r.json()["checks"]["database"] == "ok"
    assert time.monotonic() - started < 3  # one quick attempt, no retry storm


# --- logs ------------------------------------------------------------------------------------------
def test_json_log_line_per_event_and_per_rejected_heartbeat(hb: Hb, orders: GroupFixture, caplog):
    caplog.set_level(logging.INFO)
    _s, a = hb({"memberId": "a", "memberEpoch": 0})
    hb({"memberId": "a", "memberEpoch": a["memberEpoch"], "metadataEpoch": 1})  # steady: no event, no line
    fence_member("g1", "a", reason="stuck", actor="alice")
    hb({"memberId": "a", "memberEpoch": a["memberEpoch"], "metadataEpoch": 1})
    fmt = JsonFormatter()
    lines = [json.loads(fmt.format(r)) for r in caplog.records if r.name in ("coordinator.events", "coordinator.heartbeat")]
    events = [(line["event"], line.get("memberId")) for line in lines]
    assert events == [
        ("rebalanced", ""), ("joined", "a"), ("fenced", "a"), ("rebalanced", ""), ("heartbeat_rejected", "a"),
    ]
    joined = lines[1]
    # The same fields as the Event row: the join carries the epoch the member was given.
    assert joined["group"] == "g1"
    assert joined["stream"] == "orders"
    assert joined["memberEpoch"] == a["memberEpoch"] == 2
    assert joined["groupEpoch"] == 2
    assert joined["level"] == "INFO"
    fenced = lines[2]
    assert fenced["memberEpoch"] == 2
    assert fenced["groupEpoch"] == 2
    assert lines[3]["assignmentEpoch"] == 3
    assert "reason=stuck" in fenced["message"]
    assert "actor=alice" in fenced["message"]
    rejected = lines[-1]
    assert rejected["level"] == "WARNING"
    assert rejected["memberEpoch"] == a["memberEpoch"]
    assert "FENCED_MEMBER_EPOCH" in rejected["message"]
    assert "stuck" in rejected["message"]


# --- several gunicorn workers ----------------------------------------------------------------------
@pytest.fixture
def gunicorn_with_config(transactional_db: None, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """gunicorn -c coordinator_project/gunicorn_conf.py, 2 workers, with a known metrics dir."""
    prom = tmp_path / "prom"
    with running_gunicorn(PROMETHEUS_MULTIPROC_DIR=str(prom)) as server:
        yield server.url, prom


@pytest.mark.slow
def test_counters_are_summed_over_gunicorn_workers(gunicorn_with_config: tuple[str, Path]):
    url, prom = gunicorn_with_config
    fx = make_group()
    headers = {"Authorization": f"Bearer {fx.key}"}
    sent = 0
    # Fresh connections until both workers have answered heartbeats (their counter files exist).
    deadline = time.monotonic() + 20
    while len({p.name.rsplit("_", 1)[-1] for p in prom.glob("counter_*.db")}) < 2:
        assert time.monotonic() < deadline, "the second worker never answered"
        r = plain_http.post(f"{url}/api/v1/groups/g1/heartbeat", json={"memberId": f"m{sent}", "memberEpoch": 0},
                       headers=headers, timeout=5)
        assert r.status_code == 200
        sent += 1
    # Each worker folds its heartbeat counts in within FOLD_PERIOD_S: then whichever worker
    # answers a scrape reports every worker's heartbeats.
    deadline = time.monotonic() + 10
    while True:
        samples = scrape(plain_http.get(f"{url}/metrics", timeout=5).text)
        if value(samples, "rsc_heartbeat_latency_seconds_count") == sent:
            break
        assert time.monotonic() < deadline, (value(samples, "rsc_heartbeat_latency_seconds_count"), sent)
        time.sleep(0.05)
    for _ in range(6):  # whichever worker answers, it reports every worker's heartbeats
        samples = scrape(plain_http.get(f"{url}/metrics", timeout=5).text)
        assert value(samples, "rsc_heartbeats_total", error_code="NONE", status="OK") + value(
            samples, "rsc_heartbeats_total", error_code="NONE", status="REVOKE_PENDING"
        ) == sent
        assert value(samples, "rsc_heartbeat_latency_seconds_count") == sent
        assert sum(v for (n, labels), v in samples.items() if n == "rsc_group_members"
                   and dict(labels)["group"] == "g1") == sent


def test_i23_4_the_stamp_lag_is_exported(db: None):
    """How late batched last-seen stamps reach the database: the age of a batch's oldest stamp
    when it was written (L1 allows STAMP_ALLOWANCE_S)."""
    from datetime import timedelta

    from django.utils import timezone

    from assignments import fastpath

    fastpath.STAMPS.add(-1, timezone.now() - timedelta(seconds=2), None, 1)  # no such row: nothing written
    fastpath.STAMPS.flush()
    lag = value(metrics(Client()), "rsc_stamp_lag_seconds")
    assert 2.0 <= lag < 60
