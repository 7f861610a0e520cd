"""R9 under concurrency: 8 member processes against a real gunicorn (2 workers) on PostgreSQL,
with joins, leaves and restarts; no shard is ever believed owned by two members at once, and
the database never shows a shard held by a member that is not live."""
from __future__ import annotations

import multiprocessing
import threading
from collections import defaultdict

import pytest
from django.db import connections

from .conftest import LiveServer, make_group
from .r9_member import run_member

pytestmark = [pytest.mark.needs_postgres, pytest.mark.slow,
              pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]

MEMBERS = 8
SECONDS = 6.0
MIN_HEARTBEATS = 60  # per member: 480 in all, whatever the machine's load


def _db_watch(stop: threading.Event, violations: list, samples: list) -> None:
    conn = connections.create_connection("default")
    try:
        while not stop.is_set():
            with conn.cursor() as cur:
                cur.execute(
                    """SELECT s.shard_id, m.member_id, m.status FROM assignments_shardassignment a
                       JOIN groups_shard s ON s.id = a.shard_id JOIN members_member m ON m.id = a.owner_id
                       WHERE m.status NOT IN ('STABLE', 'REVOKING', 'PENDING')"""
                )
                violations.extend(cur.fetchall())
                cur.execute(
                    """SELECT count(*) FROM (SELECT a.shard_id FROM assignments_shardassignment a
                       WHERE a.owner_id IS NOT NULL GROUP BY a.group_id, a.shard_id HAVING count(*) > 1) x"""
                )
                violations.extend([("duplicate-owner-rows",)] * cur.fetchone()[0])
            samples.append(1)
            stop.wait(0.02)
    finally:
        conn.close()


def test_r9_one_owner_per_shard_with_concurrent_members(gunicorn_server: LiveServer):
    fx = make_group(stream="soak", group="soak", shards=24, heartbeat_interval_ms=50,
                    session_timeout_ms=60_000)
    stop, violations, samples = threading.Event(), [], []
    watcher = threading.Thread(target=_db_watch, args=(stop, violations, samples), daemon=True)
    watcher.start()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(MEMBERS) as pool:
        results = pool.starmap(
            run_member,
            [(gunicorn_server.url, fx.group, fx.key, f"m{i}", SECONDS, i, MIN_HEARTBEATS) for i in range(MEMBERS)],
        )
    stop.set()
    watcher.join(5)

    by_shard: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    totals: dict[str, int] = defaultdict(int)
    for result in results:
        for shard, member, start, end in result["intervals"]:
            by_shard[shard].append((start, end, member))
        for code, n in result["counts"].items():
            totals[code] += n
    overlaps = []
    for shard, spans in by_shard.items():
        spans.sort()
        reach_end, reach_member = float("-inf"), ""  # the span reaching furthest so far
        for start, end, member in spans:
            if start < reach_end and member != reach_member:
                overlaps.append((shard, reach_member, member, reach_end - start))
            if end > reach_end:
                reach_end, reach_member = end, member
    assert not overlaps, overlaps[:5]
    assert not violations, violations[:5]
    # The run did real work: many heartbeats, ownership changed hands, sweeper samples taken.
    assert totals["NONE"] > 200, totals
    assert totals.get("leave", 0) > 0
    assert sum(len(v) for v in by_shard.values()) > 24
    assert len(samples) > 10
