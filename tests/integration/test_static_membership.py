"""Static membership (PROTOCOL.md §9) over HTTP against real PostgreSQL: R1s, R2s, L1s, the fast
path, describe and the admin."""
from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from assignments import fastpath
from assignments.models import ShardAssignment
from assignments.services import heartbeat as heartbeat_service
from coordination.model import HeartbeatRequest
from dataplane.protocol import (
    ERROR_FIELDS,
    INSTANCE_REPLACED_MARKER,
    InstanceReplaced,
    instance_replaced_answer,
)
from groups.describe import describe_group
from members.models import Member
from members.services import sweep_liveness

from .conftest import Hb, make_group

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


class Static:
    """A well-behaved member with an instanceId over the heartbeat endpoint (C1–C5)."""

    def __init__(self, hb: Hb, member_id: str, instance_id: str | None) -> None:
        self.hb, self.member_id, self.instance_id = hb, member_id, instance_id
        self.epoch = 0
        self.owned: list[str] = []
        self.to_revoke: list[str] = []

    def send(self, **fields: Any) -> tuple[int, dict[str, Any]]:
        body: dict[str, Any] = {"memberId": self.member_id, "memberEpoch": self.epoch, **fields}
        if self.instance_id is not None:
            body.setdefault("instanceId", self.instance_id)
        return self.hb(body)

    def beat(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"ownedShards": []}
        if self.epoch > 0:
            extra = {"metadataEpoch": 1, "ownedShards": self.owned,
                     "revokingShards": [{"shard": s, "state": "REVOKED"} for s in self.to_revoke]}
        status, out = self.send(**extra)
        assert status == 200, out
        self.epoch = out["memberEpoch"]
        a = out["assignment"]
        self.to_revoke = list(a["revokingShards"])
        self.owned = [s for s in self.owned if s in a["assignedShards"]]
        if out["status"] == "OK":
            self.owned = sorted(set(self.owned) | set(a["assignedShards"]))
        return out


def settle(members: list[Static], group: str = "g1") -> None:
    for _ in range(8):
        for m in members:
            m.beat()
        if describe_group(group)["state"] == "STABLE":
            return
    raise AssertionError(describe_group(group))


def rows() -> dict[str, tuple[str | None, str | None, int]]:
    """shard -> (target member, owner member, grant epoch), straight from the table."""
    return {
        shard: (target, owner, epoch)
        for shard, target, owner, epoch in ShardAssignment.objects.values_list(
            "shard__shard_id", "target__member_id", "owner__member_id", "grant_epoch")
    }


@pytest.fixture
def four(api, db) -> tuple[Hb, list[Static]]:
    hb = Hb(api, make_group(shards=8))
    members = [Static(hb, f"m{i}", f"inst-{i}") for i in range(4)]
    settle(members)
    return hb, members


def test_r2s_without_instance_id_is_400_naming_member_epoch(hb: Hb):
    plain = Static(hb, "plain", None)
    plain.beat()
    before = rows()
    status, body = plain.send(memberEpoch=-2)
    assert status == 400
    assert body["errorCode"] == "INVALID_REQUEST"
    assert body["errorMessage"].startswith("memberEpoch"), body["errorMessage"]
    assert Member.objects.get(member_id="plain").status == "STABLE"
    assert rows() == before


def test_r2s_then_rejoin_with_the_same_instance_gets_the_same_shards_at_a_higher_grant_epoch(four):
    hb, (a, b, c, d) = four
    before = rows()
    held = {s for s, (_, owner, _) in before.items() if owner == "m0"}
    status, body = a.send(memberEpoch=-2)
    assert status == 200
    assert body["memberEpoch"] == -2
    assert body["errorCode"] == "NONE"
    assert Member.objects.get(member_id="m0").status == "TEMPORARILY_LEFT"
    assert rows() == before  # shards and target reserved, nothing recomputed
    for other in (b, c, d):
        other.beat()
    assert rows() == before  # nobody else got them
    restarted = Static(hb, "m0-restarted", "inst-0")
    out = restarted.beat()
    assert set(out["assignment"]["assignedShards"]) == held
    assert out["assignment"]["pendingShards"] == []
    after = rows()
    for shard, (target, owner, epoch) in before.items():
        if shard in held:
            assert after[shard][:2] == ("m0-restarted", "m0-restarted")
            assert after[shard][2] > epoch
        else:
            assert after[shard] == (target, owner, epoch)  # no other member's assignment changed
    settle([restarted, b, c, d])
    assert {s for s, (_, owner, _) in rows().items() if owner == "m0-restarted"} == held


def test_r1s_duplicate_instance_replaces_the_old_member_whose_next_heartbeat_is_unknown(four):
    hb, (a, _b, _c, _d) = four
    held = {s for s, (_, owner, _) in rows().items() if owner == "m0"}
    dup = Static(hb, "m0-duplicate", "inst-0")
    assert set(dup.beat()["assignment"]["assignedShards"]) == held
    status, body = a.send(metadataEpoch=1, ownedShards=a.owned)
    assert status == 409
    assert body["errorCode"] == "UNKNOWN_MEMBER_ID"
    assert "replaced" in body["errorMessage"]
    live = Member.objects.filter(instance_id="inst-0").exclude(status__in=["LEFT", "EXPIRED", "FENCED"])
    assert [m.member_id for m in live] == ["m0-duplicate"]


def test_r1s_replaced_members_next_heartbeat_carries_the_marker_and_an_expired_ones_does_not(four):
    """§9 keeps UNKNOWN_MEMBER_ID for the replaced member; the protocol's marker first in its
    errorMessage tells its data plane to stop rather than rejoin (and replace the new one)."""
    hb, (a, b, _c, _d) = four
    Static(hb, "m0-duplicate", "inst-0").beat()
    status, body = a.send(metadataEpoch=1, ownedShards=a.owned)
    assert status == 409
    assert body["errorCode"] == "UNKNOWN_MEMBER_ID"
    assert body["memberId"] == "m0"
    assert body["errorMessage"].startswith(INSTANCE_REPLACED_MARKER), body["errorMessage"]
    assert instance_replaced_answer(body) == InstanceReplaced("inst-0", "m0-duplicate")
    assert {k for k, v in body.items() if v is not None} <= set(ERROR_FIELDS)

    # Expired (L1) and never joined: UNKNOWN_MEMBER_ID without the marker, so C5's rejoin holds.
    assert "m1" in sweep_liveness(timezone.now() + timedelta(seconds=31)).expired["g1"]
    for member in (b, Static(hb, "stranger", "inst-9")):
        member.epoch = 3
        status, body = member.send(metadataEpoch=1, ownedShards=[])
        assert status == 409, body
        assert body["errorCode"] == "UNKNOWN_MEMBER_ID", body
        assert instance_replaced_answer(body) is None, body["errorMessage"]


def test_l1s_expiry_of_a_temporarily_left_member_moves_its_shards(four):
    _hb, (_a, b, c, d) = four
    held = {s for s, (_, owner, _) in rows().items() if owner == "m0"}
    # The -2 as if sent 29 s ago, through the same service the view calls (session timeout 30 s).
    left_at = timezone.now() - timedelta(seconds=29)
    heartbeat_service("g1", HeartbeatRequest(member_id="m0", member_epoch=-2), left_at)
    assert sweep_liveness(left_at + timedelta(seconds=29.5)).count == 0  # reserved until then
    # The session plus L1's allowance for batched stamps (fastpath.STAMP_ALLOWANCE_S, 0.5 s).
    result = sweep_liveness(left_at + timedelta(seconds=31))
    assert result.expired == {"g1": ["m0"]}
    assert Member.objects.get(member_id="m0").status == "EXPIRED"
    settle([b, c, d])
    owners = rows()
    assert all(owners[s][1] in {"m1", "m2", "m3"} for s in held)


def test_fast_path_never_answers_for_a_temporarily_left_member(four):
    _hb, (a, *_) = four
    req = HeartbeatRequest(member_id="m0", member_epoch=a.epoch, metadata_epoch=1,
                           owned_shards=tuple(a.owned), instance_id="inst-0")
    assert fastpath.eligible(req)
    assert fastpath.steady_heartbeat("g1", req, timezone.now()) is not None  # STABLE: on it
    a.send(memberEpoch=-2)
    assert fastpath.steady_heartbeat("g1", req, timezone.now()) is None
    status, body = a.send(metadataEpoch=1, ownedShards=a.owned)
    assert status == 409
    assert body["errorCode"] == "UNKNOWN_MEMBER_ID"


def test_describe_and_admin_show_instance_id_and_temporary_leave(four):
    _hb, (a, *_) = four
    a.send(memberEpoch=-2)
    doc = describe_group("g1")
    m0 = next(m for m in doc["members"] if m["memberId"] == "m0")
    assert m0["instanceId"] == "inst-0"
    assert m0["state"] == "TEMPORARILY_LEFT"
    assert 25 <= m0["expiresInS"] <= 30
    assert next(m for m in doc["members"] if m["memberId"] == "m1")["expiresInS"] is None
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", password=None))
    page = admin.get("/admin/members/member/").content.decode()
    assert "inst-0" in page
    assert re.search(r"temporarily left \(expires in \d+ s\)", page)
