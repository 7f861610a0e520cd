"""Issue 8.3 and 12.6 over HTTP against PostgreSQL: hostile bodies and names are a 4xx naming
the field (never a 500 from PostgreSQL or a RecursionError), and every error body is
errorCode, errorMessage and (where known) memberId."""
from __future__ import annotations

import json

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from dataplane.protocol import ASSIGNMENT_FIELDS, ERROR_FIELDS, REQUEST_FIELDS, RESPONSE_FIELDS
from groups.models import Stream
from members.models import Member

from .conftest import GroupFixture, Hb

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]

CONTROL = ["\x00", "\n", "\r", "\x1b", "\x7f", "\x85"]


def _joined(hb: Hb, member: str = "m1") -> dict:
    status, body = hb({"memberId": member, "memberEpoch": 0, "ownedShards": []})
    assert status == 200, body
    return body


def _assert_400_naming(status: int, body: dict, field: str) -> None:
    assert status == 400, body
    assert body["errorCode"] == "INVALID_REQUEST"
    assert body["errorMessage"].startswith(field) or f"; {field}" in body["errorMessage"], body


@pytest.mark.parametrize("char", CONTROL)
@pytest.mark.parametrize(
    ("field", "make"),
    [
        ("clientId", lambda c: {"memberId": "m1", "memberEpoch": 0, "clientId": f"host{c}1"}),
        ("ownedShards[0]", lambda c: {"memberId": "m1", "memberEpoch": 2, "metadataEpoch": 1,
                                      "ownedShards": [f"orders:1:0{c}"]}),
        ("revokingShards[0].shard", lambda c: {"memberId": "m1", "memberEpoch": 2, "metadataEpoch": 1,
                                               "revokingShards": [{"shard": f"orders{c}:1:0", "state": "REVOKED"}]}),
        ("drainedShards[0]", lambda c: {"memberId": "m1", "memberEpoch": 2, "metadataEpoch": 1,
                                        "drainedShards": [f"{c}orders:1:0"]}),
        ("memberId", lambda c: {"memberId": f"m1{c}", "memberEpoch": 0}),
    ],
)
def test_control_characters_in_a_body_field_are_400_naming_the_field(hb: Hb, field, make, char):
    _joined(hb)
    status, body = hb(make(char))
    _assert_400_naming(status, body, field)
    assert list(Member.objects.values_list("member_id", flat=True)) == ["m1"]


def test_instance_id_with_control_characters_is_400_when_the_protocol_has_it(hb: Hb):
    # §9 instanceId: validated by the same string check as clientId once the field exists.
    if "instanceId" not in REQUEST_FIELDS:
        pytest.skip("instanceId (static membership, §9) is not part of this build's wire format")
    status, body = hb({"memberId": "m1", "memberEpoch": 0, "instanceId": "i\x001"})
    _assert_400_naming(status, body, "instanceId")


def test_member_id_with_a_trailing_newline_is_refused_not_stored(hb: Hb):
    # `^...$` accepted "m1\n": full matches only.
    status, body = hb({"memberId": "m1\n", "memberEpoch": 0})
    _assert_400_naming(status, body, "memberId")
    assert not Member.objects.exists()


def test_lone_surrogate_in_client_id_is_400_not_an_encoding_500(hb: Hb):
    status, body = hb('{"memberId": "m1", "memberEpoch": 0, "clientId": "x\\ud800"}', raw=True)
    _assert_400_naming(status, body, "clientId")


def _nested(depth: int) -> str:
    return '{"memberId": "m1", "memberEpoch": 0, "clientId": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize("depth", [40, 1_000, 100_000])
def test_deeply_nested_json_is_400_not_a_recursion_error(hb: Hb, depth):
    status, body = hb(_nested(depth), raw=True)
    assert status == 400, body
    assert body["errorCode"] == "INVALID_REQUEST"
    assert body["errorMessage"].startswith("body")
    assert "nested deeper" in body["errorMessage"]


def test_nesting_within_the_limit_is_judged_by_the_validator(hb: Hb):
    status, body = hb(_nested(20), raw=True)
    _assert_400_naming(status, body, "clientId")  # "must be a string", not a parse error


def _too_big() -> str:
    return json.dumps({"memberId": "m1", "memberEpoch": 0, "clientId": "x" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE})


def test_body_over_the_upload_limit_is_413_with_the_json_error_body(hb: Hb):
    status, body = hb(_too_big(), raw=True)
    assert status == 413, body
    assert body == {"errorCode": "INVALID_REQUEST", "errorMessage": body["errorMessage"]}
    assert body["errorMessage"].startswith("body: larger than the limit")


def test_reshard_body_over_the_limit_is_413_and_deep_nesting_400(api: APIClient, orders: GroupFixture):
    url = f"/api/v1/streams/{orders.stream}/reshard"
    auth = {"HTTP_AUTHORIZATION": f"Bearer {orders.admin_key}"}
    r = api.generic("POST", url, _too_big(), content_type="application/json", **auth)
    assert r.status_code == 413
    assert r.json()["errorCode"] == "INVALID_REQUEST"
    r = api.generic("POST", url, "[" * 1000 + "]" * 1000, content_type="application/json", **auth)
    assert r.status_code == 400
    assert "nested deeper" in r.json()["errorMessage"]
    assert Stream.objects.get(name=orders.stream).write_version == 1


BAD_NAMES = ["g%00x", "g%0A", "g%0D%0Ax", "g%1B", "%C2%85", "a:b", "sp%20ace"]


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize(
    ("method", "path", "field", "key"),
    [
        ("POST", "/api/v1/groups/{}/heartbeat", "group", "key"),
        ("GET", "/api/v1/groups/{}", "group", "key"),
        ("GET", "/api/v1/streams/{}/routing", "stream", "stream_key"),
        ("POST", "/api/v1/streams/{}/reshard", "stream", "admin_key"),
    ],
)
def test_bad_name_in_the_url_is_400_naming_it_on_every_endpoint(
    api: APIClient, orders: GroupFixture, method, path, field, key, name
):
    body = json.dumps({"memberId": "m1", "memberEpoch": 0} if "heartbeat" in path else {"shards": 3})
    r = api.generic(method, path.format(name), body if method == "POST" else "", content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {getattr(orders, key)}")
    assert r.status_code == 400, r.content
    doc = r.json()
    assert doc["errorCode"] == "INVALID_REQUEST", doc
    assert doc["errorMessage"].startswith(f"{field}: "), doc
    assert "\x00" not in doc["errorMessage"]
    assert "\n" not in doc["errorMessage"]


def test_bad_name_without_a_key_is_still_401_first(api: APIClient, orders: GroupFixture):
    r = api.generic("POST", "/api/v1/groups/g%00x/heartbeat", "{}", content_type="application/json")
    assert r.status_code == 401
    assert r.json()["errorCode"] == "AUTHENTICATION_FAILED"


# --- issue 12.6: the error body ----------------------------------------------------------------
def test_error_bodies_carry_only_error_code_message_and_member_id(api: APIClient, hb: Hb, orders: GroupFixture):
    status, body = hb({"memberId": "ghost", "memberEpoch": 4, "metadataEpoch": 1})
    assert status == 409
    assert set(body) == set(ERROR_FIELDS)
    assert body["memberId"] == "ghost"
    status, body = hb({"memberId": "m1", "memberEpoch": "x"})
    assert status == 400
    assert set(body) == {"errorCode", "errorMessage"}
    r = api.post(orders.url(), {"memberId": "m1", "memberEpoch": 0}, format="json")
    assert r.status_code == 401
    assert set(r.json()) == {"errorCode", "errorMessage"}
    r = api.get("/api/v1/streams/nope/routing", HTTP_AUTHORIZATION=f"Bearer {orders.stream_key}")
    assert r.status_code == 404
    assert set(r.json()) == {"errorCode", "errorMessage"}


def test_accepted_heartbeat_still_carries_every_field(hb: Hb):
    body = _joined(hb)
    assert set(body) == set(RESPONSE_FIELDS)
    assert set(body["assignment"]) == set(ASSIGNMENT_FIELDS)
