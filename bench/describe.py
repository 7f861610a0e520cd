"""Describe and admin latency for one settled group of 1,000 members over 4,096 shards.

Prints, from one run on this machine (PostgreSQL + Redis, in-process, Django test client):
- GET /api/v1/groups/{group} (the describe document with lag/pending/DLQ of every shard):
  warm (shard figures from the ≤ 2 s cache) and with a fresh Redis read on every request
  (one pipeline of 3 × 4,096 read-only commands), p50/p95/max over N requests;
- the admin group page and the assignment matrix, warm;
- each as a ratio to its goal (describe warm < 200 ms, admin pages < 1 s).

BENCH_SCALE=10k: 10,000 members × 16,384 shards (issue 26.3), and also describe_group() (the
function behind the API and the management command) and /metrics, each against 1 s.

    make bench-describe     (DATABASE_URL defaults to postgres://postgres@127.0.0.1:5432/rsc_bench_describe,
                             dropped and recreated; REDIS_URL's database gets the shard streams, deleted after)
"""
from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LARGE = os.environ.get("BENCH_SCALE") == "10k"
MEMBERS = int(os.environ.get("BENCH_MEMBERS", 10_000 if LARGE else 1000))
SHARDS = int(os.environ.get("BENCH_SHARDS", 16_384 if LARGE else 4096))
RUNS = int(os.environ.get("BENCH_RUNS", 5 if LARGE else 30))
DB_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/rsc_bench_describe")


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


def line(label: str, ms: list[float], goal_ms: float | None) -> None:
    p50 = statistics.median(ms)
    p95 = sorted(ms)[max(0, int(len(ms) * 0.95) - 1)]
    ratio = f"   p50 / goal {goal_ms:.0f} ms = {p50 / goal_ms:.2f}x" if goal_ms else "   (no goal: once per cache period)"
    print(f"   {label:<44} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms  max {max(ms):7.1f} ms{ratio}")


def main() -> None:
    from bench.heartbeat import recreate_database

    recreate_database(DB_URL)
    os.environ["DATABASE_URL"] = DB_URL
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coordinator_project.settings")
    os.environ.setdefault("SECRET_KEY", "bench-insecure-key")  # settings refuse to load without one
    import django

    django.setup()
    import redis
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client, override_settings
    from django.test.utils import setup_test_environment

    from bench.bigroup import build_settled_group, drop_backlog
    from groups.services import create_api_key

    setup_test_environment()  # the test client's hosts and response context
    call_command("migrate", verbosity=0)
    r = redis.Redis.from_url(settings.STREAM_REDIS_URL)
    stream = f"bench-describe-{uuid.uuid4().hex[:6]}"
    print(f"== building a settled group: {MEMBERS} members × {SHARDS} shards (bulk), a small backlog per shard")
    started = time.perf_counter()
    with override_settings(MAX_SHARDS_PER_STREAM=max(SHARDS, 1024)):
        group = build_settled_group(stream, "bench", MEMBERS, SHARDS, backlog=r)
    print(f"   built in {time.perf_counter() - started:.1f} s")
    key = create_api_key(group="bench")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    admin = Client()
    admin.force_login(User.objects.create_superuser("bench", password="bench-only"))
    try:
        def describe() -> None:
            response = api.get("/api/v1/groups/bench")
            assert response.status_code == 200
            doc = response.json()  # one page (issue 26.3); the counts are the group's
            assert doc["paging"]["shards"] == SHARDS, doc["paging"]
            assert len(doc["shards"]) == min(SHARDS, doc["paging"]["pageSize"])

        describe()  # first: per-process caches
        print(f"== GET /api/v1/groups/bench, {RUNS} requests each (in-process, Django test client)")
        with override_settings(SHARD_STATS_CACHE_SECONDS=3600):
            line("describe, warm (shard figures cached)", timed(describe, RUNS), 1000 if LARGE else 200)
            if LARGE:
                from groups.describe import describe_group

                line("describe_group(), warm", timed(lambda: describe_group("bench"), RUNS), 1000)
        with override_settings(SHARD_STATS_CACHE_SECONDS=0, SHARD_STATS_STALE_SECONDS=0):
            line("describe, fresh Redis read every request", timed(describe, max(5, RUNS // 3)), None)
        print(f"== admin pages, warm, {max(5, RUNS // 3)} requests each")
        with override_settings(SHARD_STATS_CACHE_SECONDS=3600):
            for label, url in (("group page", f"/admin/groups/group/{group.pk}/change/"),
                               ("assignment matrix", f"/admin/groups/group/{group.pk}/matrix/"),
                               ("index dashboard", "/admin/"), ("/metrics", "/metrics")):
                admin.get(url)
                line(label, timed(lambda url=url: admin.get(url), max(5, RUNS // 3)), 1000)
    finally:
        drop_backlog(r, stream)
        r.close()


if __name__ == "__main__":
    main()
