"""L1–L3 through groups.sweeps: two sweeps at once do the work once; L2; SweepRun bookkeeping."""
from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
from django.db import connections
from django.utils import timezone

from assignments.services import heartbeat
from coordination.model import HeartbeatRequest, RevokeReport
from dataplane.protocol import RevokeState
from dataplane.routing import ShardKeys
from groups.models import Event, Group, Stream, SweepRun
from groups.namespace import default_key_prefix
from groups.resharding import start_reshard
from groups.services import create_group, create_stream
from groups.sweeps import run_all_sweeps, run_liveness_sweep, run_resharding_sweep
from members.models import Member

pytest_plugins = ["tests.integration.conftest_celery"]  # stream_redis
pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


def join(group: str, member: str, at: datetime) -> Any:
    r = heartbeat(group, HeartbeatRequest(member_id=member, member_epoch=0), at).response
    assert r.error_code == "NONE", r
    return r


def beat(group: str, member: str, epoch: int, at: datetime, **extra: Any) -> Any:
    metadata_epoch = Group.objects.get(name=group).metadata_epoch
    r = heartbeat(group, HeartbeatRequest(member_id=member, member_epoch=epoch, metadata_epoch=metadata_epoch,
                                          **extra), at).response
    assert r.error_code == "NONE", r
    return r


def concurrently(fn: Callable[[], dict[str, Any]], n: int = 2) -> list[dict[str, Any]]:
    """Start n calls at the same instant, each on its own thread (own DB connection)."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fn()
        except BaseException as exc:  # surfaced below
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def test_l3_two_concurrent_liveness_sweeps_expire_each_member_once():
    create_stream("sw", 4)
    now = timezone.now()
    silent: set[tuple[str, str]] = set()
    epochs_before = {}
    for g in range(8):
        name = f"sw-g{g}"
        create_group(name, "sw")
        for m in ("old1", "old2"):
            join(name, m, now - timedelta(seconds=40))
            silent.add((name, m))
        join(name, "live", now)
        epochs_before[name] = Group.objects.get(name=name).group_epoch

    results = concurrently(lambda: run_liveness_sweep(now))

    expired = [(g, m) for r in results for g, ms in r["expired"].items() for m in ms]
    assert sorted(expired) == sorted(silent)  # the work was done, and done once
    assert Event.objects.filter(kind="expired").count() == len(silent)
    assert set(Member.objects.filter(status="EXPIRED").values_list("group__name", "member_id")) == silent
    for name, before in epochs_before.items():
        assert Group.objects.get(name=name).group_epoch == before + 1  # one bump per group
    assert run_liveness_sweep(now) == {"expired": {}, "fenced": {}}


def test_l3_two_concurrent_resharding_sweeps_seal_and_retire_once(stream_redis: redis.Redis):
    create_stream("rs-conc", 4)
    create_group("rs-conc-g", "rs-conc")
    join("rs-conc-g", "m", timezone.now())  # holds v1, so the stream stops at DRAINING
    start_reshard("rs-conc", 2)
    create_stream("rs-conc2", 3)  # no groups: sealed and retired in the same pass
    start_reshard("rs-conc2", 5)
    stream_epoch = Stream.objects.get(name="rs-conc").metadata_epoch
    group_epoch = Group.objects.get(name="rs-conc-g").metadata_epoch

    results = concurrently(lambda: run_resharding_sweep(timezone.now()))

    assert sum("sealed" in r.get("rs-conc", {}) for r in results) == 1, results
    assert sum("retired" in r.get("rs-conc2", {}) for r in results) == 1, results
    for stream, kinds in {"rs-conc": ["reshard_started", "reshard_sealing", "version_sealed"],
                          "rs-conc2": ["reshard_started", "reshard_sealing", "version_sealed", "version_retired"]}.items():
        assert list(Event.objects.filter(stream__name=stream, group=None).order_by("id").values_list("kind", flat=True)) == kinds
    assert Stream.objects.get(name="rs-conc2").state == "STABLE"
    row = Stream.objects.get(name="rs-conc")
    assert (row.state, row.metadata_epoch) == ("DRAINING", stream_epoch + 2)  # SEALING, DRAINING
    assert Group.objects.get(name="rs-conc-g").metadata_epoch == group_epoch + 1
    assert stream_redis.exists(*(ShardKeys(f"rs-conc:1:{i}", default_key_prefix()).sealed for i in range(4))) == 4


def test_l2_sweep_fences_a_member_that_never_reports_revoked():
    create_stream("l2", 4)
    create_group("l2-g", "l2", rebalance_timeout_ms=5000)
    now = timezone.now()
    a = join("l2-g", "a", now)
    b = join("l2-g", "b", now)
    r = beat("l2-g", "a", a.member_epoch, now, owned_shards=a.assignment.assigned)
    assert r.status == "REVOKE_PENDING"
    assert len(r.assignment.revoking) == 2
    # a keeps heartbeating but never reports REVOKED.
    later = now + timedelta(seconds=4)
    beat("l2-g", "a", r.member_epoch, later, owned_shards=r.assignment.assigned + r.assignment.revoking,
         revoking_shards=tuple(RevokeReport(s, RevokeState.REVOKING) for s in r.assignment.revoking))
    beat("l2-g", "b", b.member_epoch, later)
    assert run_all_sweeps(later)["liveness"] == {"expired": {}, "fenced": {}}
    result = run_all_sweeps(now + timedelta(seconds=5, milliseconds=1))
    assert result["liveness"] == {"expired": {}, "fenced": {"l2-g": ["a"]}}
    m = Member.objects.get(member_id="a")
    assert (m.status, m.fenced_reason, m.fenced_by) == ("FENCED", "rebalance timeout", "sweeper")
    rb = beat("l2-g", "b", b.member_epoch, now + timedelta(seconds=6))
    assert len(rb.assignment.assigned) == 4


def test_l3_sweeps_record_their_last_run():
    before = timezone.now()
    result = run_all_sweeps()
    assert result == {"liveness": {"expired": {}, "fenced": {}}, "resharding": {}}
    runs = {r.name: r for r in SweepRun.objects.all()}
    assert set(runs) == {"liveness", "resharding"}
    for run in runs.values():
        assert before <= run.last_started_at <= run.last_finished_at <= timezone.now()
    assert runs["liveness"].last_result == {"expired": {}, "fenced": {}}
    first = runs["liveness"].last_finished_at
    concurrently(run_liveness_sweep)  # two first-after runs upsert the same row
    assert SweepRun.objects.filter(name="liveness").count() == 1
    assert SweepRun.objects.get(name="liveness").last_finished_at > first
