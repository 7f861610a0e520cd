"""L1/L2 sweeps and operator fencing through the service layer, on PostgreSQL."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from groups.services import ServiceError
from members import services
from members.models import Member

from .conftest import Hb

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


def test_l1_sweep_expires_only_silent_members(hb: Hb):
    for m in ("a", "b"):
        hb({"memberId": m, "memberEpoch": 0})
    now = timezone.now()
    assert services.groups_due_for_sweep(now) == []
    assert services.sweep_liveness(now).count == 0
    Member.objects.filter(member_id="a").update(last_heartbeat_at=now - timedelta(seconds=31))
    assert services.groups_due_for_sweep(now) == ["g1"]
    result = services.sweep_liveness(now)
    assert result.expired == {"g1": ["a"]}
    assert services.sweep_liveness(now).count == 0  # L3: idempotent
    s, r = hb({"memberId": "a", "memberEpoch": 3, "metadataEpoch": 1})
    assert s == 409
    assert r["errorCode"] == "UNKNOWN_MEMBER_ID"


def test_r8_operator_fence_then_rejoin(hb: Hb):
    s, body = hb({"memberId": "a", "memberEpoch": 0})
    services.fence_member("g1", "a", reason="stuck consumer", actor="alice")
    m = Member.objects.get(member_id="a")
    assert (m.status, m.fenced_reason, m.fenced_by) == ("FENCED", "stuck consumer", "alice")
    s, r = hb({"memberId": "a", "memberEpoch": body["memberEpoch"], "metadataEpoch": 1})
    assert s == 409
    assert r["errorCode"] == "FENCED_MEMBER_EPOCH"
    assert "stuck consumer" in r["errorMessage"]
    s, r = hb({"memberId": "a", "memberEpoch": 0})
    assert s == 200
    assert len(r["assignment"]["assignedShards"]) == 4


def test_fence_unknown_member_or_group_is_a_clear_error(hb: Hb):
    with pytest.raises(ServiceError, match="no live member 'zz'"):
        services.fence_member("g1", "zz")
    with pytest.raises(ServiceError, match="group 'nope' does not exist"):
        services.fence_member("nope", "a")


def test_i23_4_l1_allows_any_nodes_stamp_lag_whatever_this_sweepers_own_setting(hb: Hb, settings):
    """Steady heartbeats reach the database in batches, up to STAMP_ALLOWANCE_S late on any
    node (every node's period is capped). The sweeper allows that much, not its own period."""
    from assignments.fastpath import STAMP_ALLOWANCE_S, STAMP_PERIOD_MAX_S

    settings.RSC_STAMP_PERIOD_S = 0  # this node batches nothing: its own period says nothing of others
    assert STAMP_ALLOWANCE_S >= 2 * STAMP_PERIOD_MAX_S
    hb({"memberId": "a", "memberEpoch": 0})
    now = timezone.now()
    # Silent for the session (30 s) and 0.3 s more: another node's stamp may still be on its way.
    Member.objects.filter(member_id="a").update(last_heartbeat_at=now - timedelta(seconds=30.3))
    assert services.sweep_liveness(now).count == 0
    Member.objects.filter(member_id="a").update(last_heartbeat_at=now - timedelta(seconds=30 + STAMP_ALLOWANCE_S + 0.1))
    assert services.sweep_liveness(now).expired == {"g1": ["a"]}


def test_l1_a_member_answered_ok_from_a_snapshot_is_not_expired_by_a_sweep_while_its_stamp_waits(hb: Hb, monkeypatch):
    """After a coordinator restart every member's last-seen in the database may be a session
    old (the intake's up-since covers them for one session). A member whose first heartbeat
    comes later than that is answered OK from the process's snapshot; with its stamp batched,
    a sweep in the next moment expired it (seen in e2e/test_coordinator_outage.py: 21 ms
    after its accepted heartbeat), while the member, just answered OK, keeps its shards for
    a session (R9). Such a stamp is written before the answer."""
    from assignments import fastpath, snapshot_cache
    from coordinator_project.process_state import PROCESS

    _, r = hb({"memberId": "a", "memberEpoch": 0})
    _, r = hb({"memberId": "a", "memberEpoch": r["memberEpoch"], "metadataEpoch": 1,
               "ownedShards": r["assignment"]["assignedShards"]})
    epoch = r["memberEpoch"]
    assert Member.objects.get(member_id="a").status == "STABLE"
    fastpath.STAMPS.stop()
    monkeypatch.setattr(fastpath, "STAMP_PERIOD", 30.0)  # no batch lands during the test
    # The restart: the process forgets everything, and the database holds an old last-seen.
    PROCESS.reset()
    Member.objects.filter(member_id="a").update(last_heartbeat_at=timezone.now() - timedelta(seconds=40))
    snapshot_cache.refresh_snapshot("g1")  # as another member's steady heartbeat does
    s, r = hb({"memberId": "a", "memberEpoch": epoch, "metadataEpoch": 1})  # answered from the snapshot
    assert (s, r["errorCode"]) == (200, "NONE")
    assert services.sweep_liveness(timezone.now()).expired.get("g1", []) == []
    assert Member.objects.get(member_id="a").status == "STABLE"
