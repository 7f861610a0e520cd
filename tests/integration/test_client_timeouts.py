"""Issue 27.8 over HTTP: a member's rebalanceTimeoutMs is capped at its group's setting."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from members.models import Member
from members.services import sweep_liveness

from .conftest import Hb, make_group

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]

DAY_MS = 86_400_000
GROUP_MS = 10_000  # shorter than the 30 s session, so the sweep past it only fences


@pytest.fixture
def hb(api: APIClient, db: None) -> Hb:
    return Hb(api, make_group(rebalance_timeout_ms=GROUP_MS))


def test_i27_8_a_join_asking_a_day_long_rebalance_timeout_is_fenced_at_the_groups(hb: Hb):
    status, a = hb({"memberId": "a", "memberEpoch": 0, "ownedShards": [], "rebalanceTimeoutMs": DAY_MS})
    assert status == 200, a
    status, a = hb({"memberId": "a", "memberEpoch": a["memberEpoch"], "ownedShards": []})
    owned = a["assignment"]["assignedShards"]
    assert status == 200, a
    assert len(owned) == 4, a
    status, b = hb({"memberId": "b", "memberEpoch": 0, "ownedShards": []})
    assert status == 200, b
    # a is told to revoke half: its deadline is the group's 10 s, not a day.
    status, a = hb({"memberId": "a", "memberEpoch": a["memberEpoch"], "ownedShards": owned})
    told = timezone.now()
    assert status == 200, a
    assert a["assignment"]["revokingShards"], a
    row = Member.objects.get(member_id="a")
    assert row.rebalance_timeout_ms == GROUP_MS
    assert row.revocation_deadline is not None
    assert row.revocation_deadline <= told + timedelta(milliseconds=GROUP_MS)
    # The sweep a little past the group's timeout fences it (b keeps its session meanwhile).
    hb({"memberId": "b", "memberEpoch": b["memberEpoch"], "ownedShards": []})
    result = sweep_liveness(now=row.revocation_deadline + timedelta(seconds=1))
    assert result.fenced == {"g1": ["a"]}


def test_i27_8_a_shorter_rebalance_timeout_than_the_groups_is_kept(hb: Hb):
    status, a = hb({"memberId": "a", "memberEpoch": 0, "ownedShards": [], "rebalanceTimeoutMs": 5_000})
    assert status == 200, a
    assert Member.objects.get(member_id="a").rebalance_timeout_ms == 5_000


def test_i27_8_the_api_schema_states_the_cap(api: APIClient):
    r = api.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert r.status_code == 200
    assert "capped at the group's" in r.content.decode()
