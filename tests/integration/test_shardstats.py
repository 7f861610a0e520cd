"""Shard statistics (§10) against real Redis: lag, pending, DLQ, the null-lag fallback, a
missing consumer group, Redis away, and a Redis Cluster.

The test plays the consumer itself (XREADGROUP/XACK); the module under test only reads.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from dataplane.routing import ShardKeys
from groups import selectors, shardstats
from groups.models import Group
from groups.shardstats import read_shard_stats, shard_stats
from tests.dataplane.conftest import cluster_url  # noqa: F401 - session fixture: a local cluster
from tests.ports import refused_port
from tests.redis_keys import delete_keys

from .conftest import GroupFixture, Hb

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.STREAM_REDIS_URL, decode_responses=True)
    prefix = f"st-{uuid.uuid4().hex[:8]}"
    client.prefix = prefix  # type: ignore[attr-defined]
    shardstats.clear_cache()
    yield client
    delete_keys(client, f"{prefix}:*")
    shardstats.clear_cache()
    client.close()


def _fill(r: redis.Redis, key: str, n: int) -> list[str]:
    return [r.xadd(key, {"n": str(i)}) for i in range(n)]


def test_lag_pending_and_dlq_follow_reads_and_acks(r: redis.Redis):
    prefix = r.prefix  # type: ignore[attr-defined]
    shards = ["s:1:0", "s:1:1"]
    k0, k1 = (ShardKeys(s, prefix) for s in shards)
    _fill(r, k0.stream, 10)
    _fill(r, k1.stream, 3)
    r.xgroup_create(k0.stream, "g", id="0")
    r.xgroup_create(k1.stream, "g", id="0")
    got = r.xreadgroup("g", "c", {k0.stream: ">"}, count=4)
    ids = [e[0] for e in got[0][1]]
    r.xack(k0.stream, "g", ids[0], ids[1])
    r.xadd(k0.dlq("g"), {"error": "boom"})
    r.xadd(k0.dlq("other-group"), {"error": "not ours"})

    stats = read_shard_stats(r, "g", shards, prefix)
    s0, s1 = stats["s:1:0"], stats["s:1:1"]
    assert (s0.length, s0.lag, s0.pending, s0.entries_read, s0.dlq_length) == (10, 6, 2, 4, 1)
    assert s0.last_delivered_id == ids[-1]
    assert s0.lag_source == "xinfo"
    assert s0.lag_exact
    assert (s1.lag, s1.pending, s1.dlq_length, s1.last_delivered_id) == (3, 0, 0, "0-0")


def test_null_lag_after_xdel_and_xtrim_falls_back_to_a_bounded_count(r: redis.Redis):
    prefix = r.prefix  # type: ignore[attr-defined]
    key = ShardKeys("s:1:0", prefix).stream
    ids = _fill(r, key, 20)
    r.xgroup_create(key, "g", id="0")
    r.xreadgroup("g", "c", {key: ">"}, count=5)
    r.xdel(key, ids[10])  # a tombstone after last-delivered: Redis cannot tell the lag
    assert r.xinfo_groups(key)[0]["lag"] is None
    s = read_shard_stats(r, "g", ["s:1:0"], prefix)["s:1:0"]
    assert (s.lag, s.lag_source, s.lag_exact, s.pending) == (14, "xrange", True, 5)

    # Beyond the fallback's limit the figure is a lower bound, and says so.
    s = read_shard_stats(r, "g", ["s:1:0"], prefix, xrange_limit=3)["s:1:0"]
    assert (s.lag, s.lag_exact) == (3, False)

    # Trimmed past the last-delivered ID: Redis 7.0 still counts the trimmed entries; capped.

    r.xtrim(key, maxlen=8, approximate=False)  # 8 left, none of them delivered
    s = read_shard_stats(r, "g", ["s:1:0"], prefix)["s:1:0"]
    assert s.lag == 8
    assert s.length == 8

    # Moved back with XGROUP SETID (no ENTRIESREAD): 5 entries after the new position.
    r.xgroup_setid(key, "g", id=ids[14])
    s = read_shard_stats(r, "g", ["s:1:0"], prefix)["s:1:0"]
    assert (s.lag, s.last_delivered_id) == (5, ids[14])


def test_shard_without_consumer_group_counts_its_whole_length_as_lag(r: redis.Redis):
    prefix = r.prefix  # type: ignore[attr-defined]
    key = ShardKeys("s:1:0", prefix).stream
    _fill(r, key, 7)
    r.xgroup_create(key, "someone-else", id="$")
    stats = read_shard_stats(r, "g", ["s:1:0", "s:1:1"], prefix)
    assert (stats["s:1:0"].lag, stats["s:1:0"].pending, stats["s:1:0"].lag_source) == (7, 0, "no-group")
    assert stats["s:1:0"].last_delivered_id is None
    assert (stats["s:1:1"].lag, stats["s:1:1"].length, stats["s:1:1"].lag_source) == (0, 0, "no-stream")


def test_figures_are_cached_per_process_for_the_configured_time(r: redis.Redis):
    prefix = r.prefix  # type: ignore[attr-defined]
    key = ShardKeys("s:1:0", prefix).stream
    _fill(r, key, 2)
    with override_settings(SHARD_STATS_CACHE_SECONDS=60):
        first = shard_stats("g", prefix, ["s:1:0"])
        _fill(r, key, 3)
        assert shard_stats("g", prefix, ["s:1:0"]) is first  # cached: no new round trip
        assert shard_stats("g", prefix, ["s:1:0"], fresh=True).lag == 5
    with override_settings(SHARD_STATS_CACHE_SECONDS=0, SHARD_STATS_STALE_SECONDS=0):
        _fill(r, key, 1)
        assert shard_stats("g", prefix, ["s:1:0"]).lag == 6
    assert first.ok
    assert first.error is None
    assert first.lag == 2


def test_stale_figures_are_served_while_one_background_read_refreshes_them(r: redis.Redis):
    prefix = r.prefix  # type: ignore[attr-defined]
    key = ShardKeys("s:1:0", prefix).stream
    _fill(r, key, 2)
    with override_settings(SHARD_STATS_CACHE_SECONDS=0, SHARD_STATS_STALE_SECONDS=60):
        first = shard_stats("g", prefix, ["s:1:0"])  # nothing cached: read now
        _fill(r, key, 3)
        assert shard_stats("g", prefix, ["s:1:0"]) is first  # stale, served at once
        deadline = time.monotonic() + 10
        while shard_stats("g", prefix, ["s:1:0"]).lag != 5:  # the background read lands
            assert time.monotonic() < deadline, "no background refresh"
            time.sleep(0.02)  # poll interval of a deadline loop


def test_redis_away_gives_null_figures_with_a_reason_and_heartbeats_still_work(hb: Hb, orders: GroupFixture):
    shardstats.clear_cache()
    with refused_port() as port, override_settings(STREAM_REDIS_URL=f"redis://127.0.0.1:{port}/0", SHARD_STATS_SOCKET_TIMEOUT=0.2):
        stats = selectors.group_shard_stats(Group.objects.select_related("stream").get(name=orders.group))
        assert not stats.ok
        assert "ConnectionError" in (stats.error or "")
        assert stats.lag is None
        assert stats.pending is None
        assert stats.dlq is None
        assert stats.shard("orders:1:0").lag is None
        status, body = hb({"memberId": "m1", "memberEpoch": 0})
        assert status == 200
        assert body["errorCode"] == "NONE"
    shardstats.clear_cache()


def test_cluster_figures_are_read_per_node(cluster_url: str):  # noqa: F811
    from redis.cluster import RedisCluster

    rc = RedisCluster.from_url(cluster_url, decode_responses=True)
    prefix = f"cl-{uuid.uuid4().hex[:6]}"
    shards = [f"s:1:{i}" for i in range(8)]
    nodes = {rc.get_node_from_key(ShardKeys(s, prefix).stream).name for s in shards}
    assert len(nodes) > 1  # the shards spread over several nodes
    for i, s in enumerate(shards):
        k = ShardKeys(s, prefix)
        _fill(rc, k.stream, i + 1)  # type: ignore[arg-type]
        rc.xgroup_create(k.stream, "g", id="0")
        rc.xreadgroup("g", "c", {k.stream: ">"}, count=1)
        rc.xadd(k.dlq("g"), {"error": "x"})
    shardstats.clear_cache()
    try:
        with override_settings(STREAM_REDIS_URL=cluster_url, STREAM_REDIS_CLUSTER=True):
            stats = shard_stats("g", prefix, shards)
        assert stats.ok, stats.error
        assert [stats.shard(s).lag for s in shards] == list(range(8))
        assert stats.pending == 8
        assert stats.dlq == 8
    finally:
        shardstats.clear_cache()
        rc.close()
