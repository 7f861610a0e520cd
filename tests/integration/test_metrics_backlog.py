"""/metrics backlog gauges (§10): lag, pending, DLQ per group and shard, live/late members."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client, override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from groups import shardstats
from members.models import Member
from tests.ports import refused_port

from .conftest import GroupFixture, Hb
from .test_describe import _backlog, _converge, fx  # noqa: F401 - fixture
from .test_metrics import metrics, value

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


def test_backlog_gauges_show_lag_pending_and_dlq_per_group_and_shard(api: APIClient, fx: GroupFixture):  # noqa: F811
    hb = Hb(api, fx)
    _converge(hb, "a")
    _converge(hb, "b")
    _backlog(fx).close()
    m = metrics(Client())
    g, s = fx.group, fx.stream
    assert value(m, "rsc_shard_stats_up", group=g) == 1
    assert value(m, "rsc_group_lag", group=g, stream=s) == 9
    assert value(m, "rsc_group_pending", group=g, stream=s) == 3
    assert value(m, "rsc_dlq_length", group=g, stream=s) == 1
    assert value(m, "rsc_shard_lag", group=g, stream=s, shard=f"{s}:1:0") == 6
    assert value(m, "rsc_shard_lag", group=g, stream=s, shard=f"{s}:1:1") == 3
    assert value(m, "rsc_shard_pending", group=g, stream=s, shard=f"{s}:1:0") == 3
    assert ("rsc_shard_lag", (("group", g), ("shard", f"{s}:1:3"), ("stream", s))) in m  # 0 is reported too
    assert value(m, "rsc_group_members_liveness", group=g, liveness="alive") == 2

    # One member silent for > 2 heartbeat intervals: late, by the same classifier as the admin.
    Member.objects.filter(group__name=g, member_id="b").update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=7))
    m = metrics(Client())
    assert value(m, "rsc_group_members_liveness", group=g, liveness="alive") == 1
    assert value(m, "rsc_group_members_liveness", group=g, liveness="late") == 1


def test_backlog_gauges_are_left_out_when_redis_is_away(api: APIClient, fx: GroupFixture):  # noqa: F811
    shardstats.clear_cache()
    with refused_port() as port, override_settings(STREAM_REDIS_URL=f"redis://127.0.0.1:{port}/0", SHARD_STATS_SOCKET_TIMEOUT=0.2):
        m = metrics(Client())
    assert value(m, "rsc_shard_stats_up", group=fx.group) == 0
    assert not any(name == "rsc_group_lag" and dict(labels)["group"] == fx.group for name, labels in m)
    shardstats.clear_cache()


@override_settings(MAX_SHARDS_PER_STREAM=16_384)
def test_i26_3_per_shard_series_are_left_out_above_the_configured_shard_count(db: None):
    """At 16,384 shards per-shard series would be 32,768 per group and scrape: above
    METRICS_SHARD_SERIES_MAX_SHARDS (4,096) a group has its totals and a marker only."""
    import uuid

    import redis
    from django.conf import settings

    from bench.bigroup import build_settled_group, drop_backlog

    r = redis.Redis.from_url(settings.STREAM_REDIS_URL)
    stream = f"wide-{uuid.uuid4().hex[:6]}"
    shardstats.clear_cache()
    try:
        build_settled_group(stream, "wide", 2, 16_384, backlog=r)
        m = metrics(Client())
        assert value(m, "rsc_shard_series_omitted", group="wide") == 1
        assert not any(name in ("rsc_shard_lag", "rsc_shard_pending") for name, _labels in m)
        # Every shard i holds i mod 7 entries, none delivered: the total stays exact.
        assert value(m, "rsc_group_lag", group="wide", stream=stream) == sum(i % 7 for i in range(16_384))
        with override_settings(METRICS_SHARD_SERIES_MAX_SHARDS=0):  # 0: always
            m = metrics(Client())
        assert value(m, "rsc_shard_series_omitted", group="wide") == 0
        assert value(m, "rsc_shard_lag", group="wide", stream=stream, shard=f"{stream}:1:16383") == 16_383 % 7
    finally:
        drop_backlog(r, stream)
        r.close()
        shardstats.clear_cache()
