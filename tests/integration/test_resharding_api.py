"""Routing and reshard endpoints, the reshard command: auth, bad input refused, nothing changed."""
from __future__ import annotations

import os
import sys
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from groups.models import Event, Group, Shard, ShardVersion, Stream
from groups.namespace import default_key_prefix
from groups.resharding import ReshardInProgress, StreamNotFound, start_reshard
from groups.services import MAX_SHARDS, ServiceError, shard_cap
from tests import spawn

from .conftest import ROOT, GroupFixture, live_database_url, make_group

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


def snapshot() -> tuple[Any, ...]:
    """Everything a refused reshard must leave alone."""
    return (
        list(Stream.objects.order_by("id").values_list("state", "write_version", "metadata_epoch")),
        list(Group.objects.order_by("id").values_list("metadata_epoch", "group_epoch")),
        ShardVersion.objects.count(), Shard.objects.count(), Event.objects.count(),
    )


def post(api: APIClient, stream: str, body: Any, key: str | None, raw: bool = False) -> tuple[int, dict[str, Any]]:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    if raw:
        r = api.generic("POST", f"/api/v1/streams/{stream}/reshard", body, content_type="application/json", **headers)
    else:
        r = api.post(f"/api/v1/streams/{stream}/reshard", body, format="json", **headers)
    return r.status_code, r.json()


def get_routing(api: APIClient, stream: str, key: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    r = api.get(f"/api/v1/streams/{stream}/routing", **headers)
    return r.status_code, r.json()


@pytest.mark.parametrize("shards", [0, -1, MAX_SHARDS + 1, 10**12, "4", True, 2.5, None, [4]])
def test_s6_reshard_bad_shard_count_is_refused_and_changes_nothing(orders: GroupFixture, shards: Any):
    before = snapshot()
    with pytest.raises(ServiceError, match=rf"shards must be a whole number from 1 to {shard_cap()}"):
        start_reshard("orders", shards)
    assert snapshot() == before


def test_s6_reshard_unknown_stream_same_count_and_during_reshard_are_refused(orders: GroupFixture):
    before = snapshot()
    with pytest.raises(StreamNotFound, match="stream 'nope' does not exist"):
        start_reshard("nope", 3)
    with pytest.raises(ServiceError, match="already has 4 shards"):
        start_reshard("orders", 4)
    assert snapshot() == before
    start_reshard("orders", 8)
    during = snapshot()
    with pytest.raises(ReshardInProgress, match=r"already resharding \(state PREPARING, write version 2\)"):
        start_reshard("orders", 2)
    assert snapshot() == during


def test_s6_reshard_http_errors_name_the_problem(api: APIClient, orders: GroupFixture):
    other = make_group(stream="other", group="og", shards=1)
    before = snapshot()
    cases = [
        (None, "orders", {"shards": 3}, 401, "AUTHENTICATION_FAILED"),
        (orders.key, "orders", {"shards": 3}, 403, "AUTHORIZATION_FAILED"),  # a group key cannot reshard
        (other.admin_key, "orders", {"shards": 3}, 403, "AUTHORIZATION_FAILED"),
        (orders.stream_key, "orders", {"shards": 3}, 403, "AUTHORIZATION_FAILED"),  # produce cannot reshard
        (orders.admin_key, "nope", {"shards": 3}, 404, "STREAM_NOT_FOUND"),
        (orders.admin_key, "orders", {}, 400, "INVALID_REQUEST"),
        (orders.admin_key, "orders", [3], 400, "INVALID_REQUEST"),
        (orders.admin_key, "orders", {"shards": 0}, 400, "INVALID_REQUEST"),
        (orders.admin_key, "orders", {"shards": MAX_SHARDS + 1}, 400, "INVALID_REQUEST"),
        (orders.admin_key, "orders", {"shards": "3"}, 400, "INVALID_REQUEST"),
        (orders.admin_key, "orders", {"shards": 3, "force": True}, 400, "INVALID_REQUEST"),
        (orders.admin_key, "orders", {"shards": 4}, 400, "INVALID_REQUEST"),
    ]
    for key, stream, body, status, code in cases:
        s, r = post(api, stream, body, key)
        assert (s, r["errorCode"]) == (status, code), (body, r)
        assert r["errorMessage"]
    s, r = post(api, "orders", "{not json", orders.admin_key, raw=True)
    assert (s, r["errorCode"]) == (400, "INVALID_REQUEST")
    s, r = post(api, "orders", {"shards": 0}, orders.admin_key)
    assert f"shards must be a whole number from 1 to {shard_cap()}, got 0" in r["errorMessage"]
    assert snapshot() == before

    s, r = post(api, "orders", {"shards": 6}, orders.admin_key)
    assert s == 202
    assert (r["version"], r["shardCount"], r["state"]) == (2, 6, "PREPARING")
    during = snapshot()
    s, r = post(api, "orders", {"shards": 2}, orders.admin_key)
    assert (s, r["errorCode"]) == (409, "RESHARD_IN_PROGRESS")
    assert "wait until it is STABLE" in r["errorMessage"]
    assert snapshot() == during


def test_routing_document_for_stream_and_group_keys(api: APIClient, orders: GroupFixture):
    other = make_group(stream="other", group="og", shards=1)
    s, doc = get_routing(api, "orders", orders.stream_key)
    assert s == 200
    assert {k: doc[k] for k in ("stream", "writeVersion", "metadataEpoch", "state", "hash", "keyPrefix")} == {
        "stream": "orders", "writeVersion": 1, "metadataEpoch": 1, "state": "STABLE",
        "hash": "blake2b-64", "keyPrefix": default_key_prefix(),
    }
    (v1,) = doc["versions"]
    assert (v1["version"], v1["shardCount"], v1["state"]) == (1, 4, "ACTIVE")
    # §6: the version's shape, not its shards (the producer derives them, dataplane.routing).
    assert v1 == {"stream": "orders", "version": 1, "state": "ACTIVE", "shardCount": 4, "parentVersion": None,
                  "parentShardCount": None, "keyPrefix": default_key_prefix()}
    assert get_routing(api, "orders", orders.key) == (200, doc)  # a group key of that stream may read
    for key, stream, status, code in [
        (None, "orders", 401, "AUTHENTICATION_FAILED"),
        (other.key, "orders", 403, "AUTHORIZATION_FAILED"),
        (other.stream_key, "orders", 403, "AUTHORIZATION_FAILED"),
        (orders.stream_key, "nope", 404, "STREAM_NOT_FOUND"),
    ]:
        s, r = get_routing(api, stream, key)
        assert (s, r["errorCode"]) == (status, code)


def test_reshard_command_reports_and_refuses(orders: GroupFixture, capsys: pytest.CaptureFixture[str]):
    call_command("reshard", "orders", "--shards", "3", "-v", "2")
    out = capsys.readouterr().out
    assert "version 2 with 3 shards created; state PREPARING" in out
    assert "orders:2:1 <- orders:1:1, orders:1:2" in out
    with pytest.raises(CommandError, match="already resharding"):
        call_command("reshard", "orders", "--shards", "5")
    with pytest.raises(CommandError, match="stream 'nope' does not exist"):
        call_command("reshard", "nope", "--shards", "5")


def test_reshard_command_exits_non_zero_on_bad_input(orders: GroupFixture):
    env = dict(os.environ, DATABASE_URL=live_database_url())
    proc = spawn.run(
        [sys.executable, "manage.py", "reshard", "orders", "--shards", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert f"shards must be a whole number from 1 to {shard_cap()}, got 0" in proc.stderr
    assert ShardVersion.objects.count() == 1
