"""Describe API and `describe_group` (§10): shards with owner, lag, pending, DLQ; members with
seconds since their last heartbeat; Redis away → figures null with the reason, still 200."""
from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from rest_framework.test import APIClient

from tests.ports import refused_port

from .conftest import GroupFixture, Hb, group_on_fresh_stream

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


@pytest.fixture
def fx() -> Iterator[GroupFixture]:
    with group_on_fresh_stream("desc", "dg") as fixture:
        yield fixture


def _converge(hb: Hb, member: str) -> dict:
    status, body = hb({"memberId": member, "memberEpoch": 0, "ownedShards": [], "clientId": f"host/{member}"})
    assert status == 200, body
    owned = body["assignment"]["assignedShards"]
    status, body = hb({"memberId": member, "memberEpoch": body["memberEpoch"], "ownedShards": owned,
                       "metadataEpoch": body["metadata"]["metadataEpoch"]})
    assert status == 200, body
    return body


def _backlog(fx: GroupFixture) -> redis.Redis:
    """Shard 0: 10 entries, 4 read by the group, 1 ACKed; one DLQ entry. Shard 1: 3 unread."""
    r = redis.Redis.from_url(settings.STREAM_REDIS_URL, decode_responses=True)
    k0, k1 = fx.keys(f"{fx.stream}:1:0"), fx.keys(f"{fx.stream}:1:1")
    for i in range(10):
        r.xadd(k0.stream, {"n": str(i)})
    for i in range(3):
        r.xadd(k1.stream, {"n": str(i)})
    fx.drop_consumer_groups(r)  # shards nobody read have none
    r.xgroup_create(k0.stream, fx.group, id="0")
    got = r.xreadgroup(fx.group, "c", {k0.stream: ">"}, count=4)
    r.xack(k0.stream, fx.group, got[0][1][0][0])
    r.xadd(k0.dlq(fx.group), {"error": "boom"})
    return r


def test_describe_api_shows_shards_with_lag_pending_dlq_and_totals(api: APIClient, fx: GroupFixture):
    hb = Hb(api, fx)
    _converge(hb, "a")
    r = _backlog(fx)
    doc = api.get(fx.url(""), HTTP_AUTHORIZATION=f"Bearer {fx.key}").json()
    assert doc["redis"]["ok"] is True
    assert doc["redis"]["error"] is None
    assert doc["redis"]["asOf"]
    assert doc["totals"] == {"lag": 6 + 3, "pending": 3, "dlq": 1}
    shards = {s["shardId"]: s for s in doc["shards"]}
    assert list(shards) == [f"{fx.stream}:1:{i}" for i in range(4)]
    s0 = shards[f"{fx.stream}:1:0"]
    assert (s0["lag"], s0["pending"], s0["dlqLength"], s0["entriesRead"]) == (6, 3, 1, 4)
    assert s0["lastDeliveredId"] == r.xinfo_groups(fx.keys(s0["shardId"]).stream)[0]["last-delivered-id"]
    assert (s0["owner"], s0["clientId"], s0["instanceId"], s0["state"], s0["version"]) == ("a", "host/a", None, "granted", 1)
    s1 = shards[f"{fx.stream}:1:1"]
    assert (s1["lag"], s1["pending"], s1["lastDeliveredId"]) == (3, 0, None)  # no consumer group yet
    member = doc["members"][0]
    assert isinstance(member["sinceLastHeartbeatMs"], int)
    assert 0 <= member["sinceLastHeartbeatMs"] < 60_000
    assert member["instanceId"] is None
    assert member["liveness"] == "alive"
    r.close()


def test_describe_api_with_redis_away_is_200_with_null_figures_and_the_reason(api: APIClient, fx: GroupFixture):
    hb = Hb(api, fx)
    _converge(hb, "a")
    with refused_port() as port, override_settings(STREAM_REDIS_URL=f"redis://127.0.0.1:{port}/0", SHARD_STATS_SOCKET_TIMEOUT=0.2):
        r = api.get(fx.url(""), HTTP_AUTHORIZATION=f"Bearer {fx.key}")
        assert r.status_code == 200
        doc = r.json()
        assert doc["redis"]["ok"] is False
        assert "ConnectionError" in doc["redis"]["error"]
        assert doc["totals"] == {"lag": None, "pending": None, "dlq": None}
        assert all(s["lag"] is None and s["owner"] == "a" for s in doc["shards"])
        text = StringIO()
        call_command("describe_group", fx.group, stdout=text)
        assert "Redis not readable: ConnectionError" in text.getvalue()
        status, body = hb({"memberId": "a", "memberEpoch": doc["members"][0]["memberEpoch"]})
        assert status == 200
        assert body["errorCode"] == "NONE"


def test_describe_group_command_prints_shard_and_member_tables(api: APIClient, fx: GroupFixture):
    hb = Hb(api, fx)
    _converge(hb, "a")
    _backlog(fx).close()
    out = StringIO()
    call_command("describe_group", fx.group, stdout=out)
    lines = out.getvalue().splitlines()
    assert "TOTAL LAG 9  PENDING 3  DLQ 1" in lines[1]
    header = next(line for line in lines if line.startswith("SHARD"))
    assert header.split() == ["SHARD", "STATE", "OWNER", "CLIENT", "LAST-DELIVERED", "LAG", "PENDING", "DLQ"]
    row0 = next(line for line in lines if line.startswith(f"{fx.stream}:1:0 ")).split()
    assert row0[1:4] == ["granted", "a", "host/a"]
    assert row0[5:] == ["6", "3", "1"]
    row1 = next(line for line in lines if line.startswith(f"{fx.stream}:1:1 ")).split()
    assert row1[4:] == ["-", "3", "0", "0"]  # no consumer group yet: no last-delivered ID
    mheader = next(line for line in lines if line.startswith("MEMBER"))
    assert "SECONDS-SINCE-HEARTBEAT" in mheader
    assert "LIVENESS" in mheader
    mrow = next(line for line in lines if line.startswith("a ")).split()
    assert mrow[-1] == "alive"
    assert float(mrow[-2]) < 60

    js = StringIO()
    call_command("describe_group", fx.group, "--json", stdout=js)
    doc = json.loads(js.getvalue())
    assert doc["totals"] == {"lag": 9, "pending": 3, "dlq": 1}
    assert len(doc["shards"]) == 4


def test_openapi_schema_lists_members_and_shards_as_arrays(api: APIClient, db: None):
    schema = api.get("/api/schema/", {"format": "json"}).json()
    described = schema["components"]["schemas"]["DescribedGroup"]["properties"]
    assert described["members"]["type"] == "array"
    assert described["shards"]["type"] == "array"
    assert {"lag", "pending", "dlq"} <= set(schema["components"]["schemas"]["DescribedTotals"]["properties"])


def test_i25_7_describe_and_the_admin_show_each_members_library_version_recorded_at_join(api: APIClient, fx: GroupFixture):
    """The member's User-Agent (``rsc-dataplane/<ver> python/<ver>``) names its library: the
    join records its first product in the member row (with the join's own write); steady
    heartbeats neither read nor write it; a rejoin with another version replaces it."""
    from django.contrib.auth.models import User
    from django.db import connections
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from members.models import Member

    auth = {"HTTP_AUTHORIZATION": f"Bearer {fx.key}"}

    def beat(body: dict, agent: str) -> dict:
        r = api.post(fx.url(), body, format="json", HTTP_USER_AGENT=agent, **auth)
        assert r.status_code == 200, r.content
        return r.json()

    joined = beat({"memberId": "a", "memberEpoch": 0, "clientId": "host/a"}, "rsc-dataplane/0.2.0 python/3.11.9")
    beat({"memberId": "b", "memberEpoch": 0}, "curl/8.5.0")
    beat({"memberId": "c", "memberEpoch": 0}, "")
    assert Member.objects.get(member_id="a").library_version == "rsc-dataplane/0.2.0"
    # Steady heartbeats with another User-Agent: nothing about the version is read or written.
    with CaptureQueriesContext(connections["default"]) as q1, CaptureQueriesContext(connections["liveness"]) as q2:
        epoch = joined["memberEpoch"]
        for _ in range(3):
            body = beat({"memberId": "a", "memberEpoch": epoch}, "rsc-dataplane/9.9.9 python/3.13.0")
            epoch = body["memberEpoch"]
    assert [q["sql"] for q in (*q1.captured_queries, *q2.captured_queries) if "library_version" in q["sql"]] == []
    assert Member.objects.get(member_id="a").library_version == "rsc-dataplane/0.2.0"

    doc = api.get(fx.url(""), **auth).json()
    versions = {m["memberId"]: m["libraryVersion"] for m in doc["members"]}
    assert versions == {"a": "rsc-dataplane/0.2.0", "b": "curl/8.5.0", "c": ""}

    # A new process (a rejoin) with another library version replaces it.
    beat({"memberId": "a", "memberEpoch": 0}, "rsc-dataplane/0.3.0")
    assert Member.objects.get(member_id="a").library_version == "rsc-dataplane/0.3.0"

    out = StringIO()
    call_command("describe_group", fx.group, stdout=out)
    lines = out.getvalue().splitlines()
    mheader = next(line for line in lines if line.startswith("MEMBER")).split()
    column = mheader.index("LIBRARY")
    rows = {line.split()[0]: line.split() for line in lines[lines.index(next(x for x in lines if x.startswith("MEMBER"))) + 1:]
            if line.split() and line.split()[0] in {"a", "b", "c"}}
    assert rows["a"][column] == "rsc-dataplane/0.3.0"
    assert rows["c"][column] == "-"

    root = Client()
    root.force_login(User.objects.create_superuser("root-25-7", password=None))
    page = root.get("/admin/members/member/").content.decode()
    assert "rsc-dataplane/0.3.0" in page
    assert "curl/8.5.0" in page
