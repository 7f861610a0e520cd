"""The heartbeat endpoint against real PostgreSQL: status table, R1–R8 over HTTP, validation."""
from __future__ import annotations

import pytest

from assignments.models import ShardAssignment
from dataplane.routing import document_versions
from groups.namespace import default_key_prefix
from members.models import Member

from .conftest import Hb, make_group

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


def join(hb: Hb, member: str = "m1") -> dict:
    status, body = hb({"memberId": member, "memberEpoch": 0, "ownedShards": []})
    assert status == 200, body
    return body


def test_r1_join_over_http_returns_full_response(hb: Hb):
    body = join(hb)
    assert body["errorCode"] == "NONE"
    assert body["errorMessage"] is None
    assert body["status"] == "OK"
    assert body["memberEpoch"] == body["assignmentEpoch"] == 2
    assert body["heartbeatIntervalMs"] == 3000
    assert body["assignment"] == {
        "assignedShards": ["orders:1:0", "orders:1:1", "orders:1:2", "orders:1:3"],
        "pendingShards": [],
        "revokingShards": [],
    }
    md = body["metadata"]
    assert md["metadataEpoch"] == 1
    assert md["stream"] == "orders"
    assert md["keyPrefix"] == default_key_prefix()
    # §3: the version, not its shards; the member derives each shard's keys (dataplane.routing).
    assert md["versions"] == [{
        "stream": "orders", "version": 1, "state": "ACTIVE", "shardCount": 4, "parentVersion": None,
        "parentShardCount": None, "keyPrefix": default_key_prefix(),
    }]
    (version,) = document_versions(md)
    assert version.keys(1).stream == f"{default_key_prefix()}:{{orders:1:1}}"
    assert version.keys(1).sealed == f"{default_key_prefix()}:{{orders:1:1}}:sealed"


def test_r1_join_answer_carries_the_cached_metadata_text_byte_for_byte(api, orders):
    """The join's body is exactly what DRF's JSONRenderer writes, though the metadata
    document's text comes from the per-epoch cache (HeartbeatRenderer)."""
    from rest_framework.renderers import JSONRenderer

    from assignments.views import HeartbeatRenderer
    from groups.metadata import group_metadata, rendered
    from groups.models import Group

    headers = {"HTTP_AUTHORIZATION": f"Bearer {orders.key}"}
    r = api.post(orders.url(), {"memberId": "m1", "memberEpoch": 0}, format="json", **headers)
    assert r.status_code == 200
    assert r.content == JSONRenderer().render(r.json())
    group = Group.objects.select_related("stream").get(name=orders.group)
    doc = group_metadata(group)
    assert rendered(doc) is rendered(doc)  # rendered once per document
    assert rendered({**doc}) is None  # not a cached document: rendered the usual way
    body = {"errorCode": "NONE", "memberId": "m\u2028é", "metadata": doc}
    assert HeartbeatRenderer().render(body) == JSONRenderer().render(body)
    moved = {"metadata": doc, "errorCode": "NONE"}  # metadata not last: no splice
    assert HeartbeatRenderer().render(moved) == JSONRenderer().render(moved)


def test_r1_two_members_converge_and_db_has_one_owner_per_shard(hb: Hb):
    a = join(hb, "a")
    b = join(hb, "b")
    assert b["assignment"]["assignedShards"] == []
    assert len(b["assignment"]["pendingShards"]) == 2
    _, ra = hb({"memberId": "a", "memberEpoch": a["memberEpoch"], "metadataEpoch": 1,
                "ownedShards": a["assignment"]["assignedShards"]})
    assert ra["status"] == "REVOKE_PENDING"
    revoking = ra["assignment"]["revokingShards"]
    kept = ra["assignment"]["assignedShards"]
    _, ra2 = hb({"memberId": "a", "memberEpoch": ra["memberEpoch"], "metadataEpoch": 1,
                 "ownedShards": kept, "revokingShards": [{"shard": x, "state": "REVOKED"} for x in revoking]})
    assert ra2["status"] == "OK"
    assert ra2["memberEpoch"] == 3
    _s, rb = hb({"memberId": "b", "memberEpoch": b["memberEpoch"], "metadataEpoch": 1, "ownedShards": []})
    assert rb["status"] == "OK"
    assert rb["assignment"]["assignedShards"] == sorted(revoking)
    owners = list(ShardAssignment.objects.values_list("shard__shard_id", "owner__member_id"))
    assert len(owners) == 4
    assert len({s for s, _ in owners}) == 4


def test_r1_join_with_owned_shards_is_409_fenced(hb: Hb):
    s, body = hb({"memberId": "m1", "memberEpoch": 0, "ownedShards": ["orders:1:0"]})
    assert s == 409
    assert body["errorCode"] == "FENCED_MEMBER_EPOCH"
    assert body["memberId"] == "m1"
    assert not Member.objects.exists()


def test_r1_group_max_size_reached_is_409(api):
    fx = make_group(stream="s2", group="small", max_members=1)
    hb = Hb(api, fx)
    join(hb, "a")
    s, body = hb({"memberId": "b", "memberEpoch": 0})
    assert s == 409
    assert body["errorCode"] == "GROUP_MAX_SIZE_REACHED"


def test_r2_leave_is_answered_with_epoch_minus_one_twice(hb: Hb):
    join(hb)
    for _ in range(2):
        s, body = hb({"memberId": "m1", "memberEpoch": -1})
        assert s == 200
        assert body["memberEpoch"] == -1
        assert body["errorCode"] == "NONE"
    assert ShardAssignment.objects.filter(owner__isnull=False).count() == 0


def test_r3_epoch_mismatch_is_409_fenced_and_changes_nothing(hb: Hb):
    body = join(hb)
    before = Member.objects.get().last_heartbeat_at
    s, r = hb({"memberId": "m1", "memberEpoch": body["memberEpoch"] + 1, "metadataEpoch": 1})
    assert s == 409
    assert r["errorCode"] == "FENCED_MEMBER_EPOCH"
    assert Member.objects.get().last_heartbeat_at == before


def test_r4_stale_ownership_is_fenced(hb: Hb):
    a = join(hb, "a")
    join(hb, "b")
    s, r = hb({"memberId": "b", "memberEpoch": 3, "metadataEpoch": 1,
               "ownedShards": [a["assignment"]["assignedShards"][0]]})
    assert s == 409
    assert r["errorCode"] == "FENCED_MEMBER_EPOCH"
    assert "stale ownership" in r["errorMessage"]


def test_r7_stale_metadata_epoch_gets_sync_metadata_with_full_metadata(hb: Hb):
    body = join(hb)
    s, r = hb({"memberId": "m1", "memberEpoch": body["memberEpoch"], "metadataEpoch": 0})
    assert s == 200
    assert r["status"] == "SYNC_METADATA"
    assert "versions" in r["metadata"]


def test_r8_unknown_member_is_409_unknown_member_id(hb: Hb):
    s, r = hb({"memberId": "ghost", "memberEpoch": 4, "metadataEpoch": 1})
    assert s == 409
    assert r["errorCode"] == "UNKNOWN_MEMBER_ID"
    assert r["memberId"] == "ghost"


def test_steady_heartbeat_fast_path_matches_core_answer(hb: Hb):
    body = join(hb)
    req = {"memberId": "m1", "memberEpoch": body["memberEpoch"], "metadataEpoch": 1,
           "ownedShards": body["assignment"]["assignedShards"]}
    s, r = hb(req)
    assert s == 200
    assert r["status"] == "OK"
    assert r["assignment"] == body["assignment"]
    assert r["memberEpoch"] == body["memberEpoch"]
    assert r["metadata"] == {"metadataEpoch": 1}
    s, r_null = hb({**req, "ownedShards": None})
    assert r_null == r


def test_steady_heartbeat_fast_path_does_not_accept_stale_ownership(hb: Hb):
    a = join(hb, "a")
    b = join(hb, "b")
    # b is PENDING; a claims one more shard than it holds → must still be fenced.
    _s, r = hb({"memberId": "b", "memberEpoch": b["memberEpoch"], "metadataEpoch": 1,
               "ownedShards": [a["assignment"]["assignedShards"][0]]})
    assert r["errorCode"] == "FENCED_MEMBER_EPOCH"


def test_group_id_not_found_is_404(api, orders):
    r = api.post("/api/v1/groups/nope/heartbeat", {"memberId": "m", "memberEpoch": 0}, format="json",
                 HTTP_AUTHORIZATION=f"Bearer {orders.key}")
    assert r.status_code == 404
    assert r.json()["errorCode"] == "GROUP_ID_NOT_FOUND"


def test_auth_missing_unknown_and_other_groups_key(api, orders):
    other = make_group(stream="s2", group="g2")
    body = {"memberId": "m", "memberEpoch": 0}
    r = api.post(orders.url(), body, format="json")
    assert r.status_code == 401
    assert r.json()["errorCode"] == "AUTHENTICATION_FAILED"
    r = api.post(orders.url(), body, format="json", HTTP_AUTHORIZATION="Bearer rsc_nope")
    assert r.status_code == 401
    r = api.post(orders.url(), body, format="json", HTTP_AUTHORIZATION=f"Bearer {other.key}")
    assert r.status_code == 403
    assert r.json()["errorCode"] == "AUTHORIZATION_FAILED"
    r = api.post(orders.url(), body, format="json", HTTP_AUTHORIZATION=f"Bearer {orders.stream_key}")
    assert r.status_code == 403
    r = api.get(orders.url(""), HTTP_AUTHORIZATION=f"Bearer {other.key}")
    assert r.status_code == 403


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"memberEpoch": 0}, "memberId"),
        ({"memberId": "m"}, "memberEpoch"),
        ({"memberId": "", "memberEpoch": 0}, "memberId"),
        ({"memberId": "x" * 65, "memberEpoch": 0}, "memberId"),
        ({"memberId": "bad id!", "memberEpoch": 0}, "memberId"),
        ({"memberId": 7, "memberEpoch": 0}, "memberId"),
        ({"memberId": "m", "memberEpoch": -2}, "memberEpoch"),  # no instanceId (§9 R2s)
        ({"memberId": "m", "memberEpoch": -3}, "memberEpoch"),
        ({"memberId": "m", "memberEpoch": 0, "instanceId": "bad id"}, "instanceId"),
        ({"memberId": "m", "memberEpoch": 0, "instanceId": "x" * 65}, "instanceId"),
        ({"memberId": "m", "memberEpoch": 0, "instanceId": "inst\n"}, "instanceId"),
        ({"memberId": "m\n", "memberEpoch": 0}, "memberId"),
        ({"memberId": "m", "memberEpoch": "1"}, "memberEpoch"),
        ({"memberId": "m", "memberEpoch": 1.0}, "memberEpoch"),
        ({"memberId": "m", "memberEpoch": True}, "memberEpoch"),
        ({"memberId": "m", "memberEpoch": 2**40}, "memberEpoch"),
        ({"memberId": "m", "memberEpoch": 1, "metadataEpoch": "x"}, "metadataEpoch"),
        ({"memberId": "m", "memberEpoch": 1, "ownedShards": "orders:1:0"}, "ownedShards"),
        ({"memberId": "m", "memberEpoch": 1, "ownedShards": [1]}, "ownedShards"),
        ({"memberId": "m", "memberEpoch": 1, "ownedShards": ["s"] * 10_001}, "ownedShards"),
        ({"memberId": "m", "memberEpoch": 1, "revokingShards": {"shard": "a"}}, "revokingShards"),
        ({"memberId": "m", "memberEpoch": 1, "revokingShards": [{"shard": "orders:1:0", "state": "GONE"}]},
         "revokingShards[0].state"),
        ({"memberId": "m", "memberEpoch": 1, "revokingShards": [{"state": "REVOKED"}]},
         "revokingShards[0].shard"),
        ({"memberId": "m", "memberEpoch": 1, "drainedShards": [None]}, "drainedShards"),
        ({"memberId": "m", "memberEpoch": 0, "rebalanceTimeoutMs": 0}, "rebalanceTimeoutMs"),
        ({"memberId": "m", "memberEpoch": 0, "clientId": 5}, "clientId"),
        ([1, 2], "body"),
    ],
)
def test_invalid_request_is_400_naming_the_field(hb: Hb, body, field):
    s, r = hb(body)
    assert s == 400, r
    assert r["errorCode"] == "INVALID_REQUEST"
    assert r["errorMessage"].startswith(field) or f"; {field}" in r["errorMessage"], r["errorMessage"]
    assert not Member.objects.exists()


@pytest.mark.parametrize("raw", ["{not json", "", "null", "\"str\"", "[]"])
def test_invalid_request_non_json_or_non_object_body_is_400(hb: Hb, raw):
    s, r = hb(raw, raw=True)
    assert s == 400
    assert r["errorCode"] == "INVALID_REQUEST"
    assert r["errorMessage"].startswith("body")


def test_describe_group(api, hb: Hb, orders):
    body = join(hb, "a")
    join(hb, "b")
    r = api.get(orders.url(""), HTTP_AUTHORIZATION=f"Bearer {orders.key}")
    assert r.status_code == 200
    d = r.json()
    assert d["group"] == "g1"
    assert d["stream"] == "orders"
    assert d["state"] == "RECONCILING"
    assert (d["groupEpoch"], d["assignmentEpoch"], d["metadataEpoch"]) == (3, 3, 1)
    a = d["members"][0]
    assert a["memberId"] == "a"
    assert a["memberEpoch"] == body["memberEpoch"]
    assert set(a) == {"memberId", "instanceId", "clientId", "memberEpoch", "state", "liveness", "assignedShards",
                      "pendingShards", "revokingShards", "targetShards", "lastHeartbeatAt", "sinceLastHeartbeatMs",
                      "libraryVersion",
                      "expiresInS"}
    assert len(a["targetShards"]) == 2
    assert len(a["assignedShards"]) == 4


def test_openapi_schema_describes_heartbeat(api, db):
    r = api.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert r.status_code == 200
    schema = r.json() if r["Content-Type"].startswith("application/json") else None
    text = r.content.decode()
    assert "/api/v1/groups/{group}/heartbeat" in text
    assert "revokingShards" in text
    assert schema is None or "HeartbeatRequestRequest" in str(schema) or "HeartbeatRequest" in text


def test_healthz_and_readyz(api, db):
    assert api.get("/healthz").status_code == 200
    r = api.get("/readyz")
    assert r.status_code == 200
    assert r.json()["checks"]["database"] == "ok"


def test_openapi_request_fields_match_the_protocol():
    from assignments.serializers import HeartbeatRequestSerializer
    from dataplane.protocol import REQUEST_FIELDS

    assert set(HeartbeatRequestSerializer().fields) == set(REQUEST_FIELDS)


def test_openapi_response_fields_match_the_protocol():
    from assignments.serializers import ErrorBodySerializer, HeartbeatResponseSerializer
    from dataplane.protocol import ASSIGNMENT_FIELDS, ERROR_FIELDS, RESPONSE_FIELDS

    response = HeartbeatResponseSerializer()
    assert set(response.fields) == set(RESPONSE_FIELDS)
    assert set(response.fields["assignment"].fields) == set(ASSIGNMENT_FIELDS)
    assert set(ErrorBodySerializer().fields) == set(ERROR_FIELDS)


def test_steady_heartbeat_survives_a_broken_liveness_connection(hb: Hb):
    from django.db import connections

    body = join(hb)
    req = {"memberId": "m1", "memberEpoch": body["memberEpoch"], "metadataEpoch": 1,
           "ownedShards": body["assignment"]["assignedShards"]}
    assert hb(req)[0] == 200  # opens the liveness connection
    conn = connections["liveness"]
    conn.ensure_connection()
    conn.connection.close()  # psycopg closed underneath Django: the next use fails
    s, r = hb(req)
    assert s == 200
    assert r["status"] == "OK"
    assert r["assignment"] == body["assignment"]
    assert hb(req)[0] == 200  # and the path recovers with a new connection
