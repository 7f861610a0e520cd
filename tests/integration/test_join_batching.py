"""R1b join batching against real PostgreSQL: joins within the window are answered at once with an
empty assignment and assigned by one recompute at the first locked heartbeat or sweep after
it; the steady path never answers for a group whose recompute waits."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from assignments import fastpath, snapshot_cache
from assignments.encoder import response_body
from assignments.services import heartbeat as heartbeat_service
from coordination.model import HeartbeatRequest
from groups.describe import describe_group
from groups.models import Event, Group
from members.services import sweep_liveness

from .conftest import Hb

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]

WINDOW = override_settings(RSC_REBALANCE_WINDOW_MS=1000)


def beat(member_id: str, epoch: int, now: Any, owned: tuple[str, ...] = ()) -> dict[str, Any]:
    req = HeartbeatRequest(member_id=member_id, member_epoch=epoch, metadata_epoch=1, owned_shards=owned)
    result = heartbeat_service("g1", req, now)
    assert result.response.error_code == "NONE", result.response
    return response_body(result)


def rebalanced() -> int:
    return Event.objects.filter(group__name="g1", kind="rebalanced").count()


@WINDOW
def test_r1b_joins_in_one_window_are_assigned_by_one_recompute(hb: Hb):
    status, first = hb({"memberId": "m0", "memberEpoch": 0, "ownedShards": []})
    assert status == 200
    assert first["status"] == "OK"
    assert first["memberEpoch"] == 1
    assert first["assignment"] == {"assignedShards": [], "pendingShards": [], "revokingShards": []}
    assert first["metadata"]["metadataEpoch"] == 1  # a join still gets the full metadata
    t0 = Group.objects.get(name="g1").rebalance_deferred_at  # when that join was applied
    late = [beat(f"m{i}", 0, t0 + timedelta(milliseconds=100 * i)) for i in (1, 2, 3)]
    assert all(r["assignment"]["pendingShards"] == [] for r in late)
    assert rebalanced() == 0
    assert describe_group("g1")["state"] == "ASSIGNING"
    due = Group.objects.get(name="g1").rebalance_due_at
    assert due == t0 + timedelta(seconds=1.3)  # a window after the last join
    out = beat("m1", 1, due)  # the first locked heartbeat at the due time assigns all four
    assert rebalanced() == 1
    assert out["memberEpoch"] == out["assignmentEpoch"] == 5
    assert len(out["assignment"]["assignedShards"]) == 1
    after = [beat(f"m{i}", 1, due + timedelta(milliseconds=10)) for i in (0, 2, 3)]
    assert all(len(r["assignment"]["assignedShards"]) == 1 for r in after)
    assert describe_group("g1")["state"] == "STABLE"
    assert rebalanced() == 1


@WINDOW
def test_r1b_steady_path_answers_until_the_recompute_is_due_and_never_after(hb: Hb):
    t0 = timezone.now() - timedelta(seconds=10)
    beat("m0", 0, t0)
    out = beat("m0", 1, t0 + timedelta(seconds=1))  # assigned: all four shards
    owned = tuple(out["assignment"]["assignedShards"])
    assert len(owned) == 4
    beat("m1", 0, t0 + timedelta(seconds=1.5))  # within the window: waits until t0 + 2.5 s
    req = HeartbeatRequest(member_id="m0", member_epoch=out["memberEpoch"], metadata_epoch=1, owned_shards=owned)
    for cached in (False, True):  # the statement, then the cached core answer
        if not cached:
            snapshot_cache.forget_snapshots()
        else:
            snapshot_cache.refresh_snapshot("g1")
        steady = fastpath.steady_heartbeat("g1", req, t0 + timedelta(seconds=1.8))
        assert steady is not None
        assert steady.response.assignment.assigned == owned
        assert fastpath.steady_heartbeat("g1", req, t0 + timedelta(seconds=2.5)) is None
    result = heartbeat_service("g1", req, t0 + timedelta(seconds=2.5))
    assert result.path == "locked"
    assert result.response.status == "REVOKE_PENDING"


@WINDOW
def test_r1b_sweep_runs_a_due_recompute_nobody_heartbeats_for(hb: Hb):
    t0 = timezone.now() - timedelta(seconds=10)
    beat("m0", 0, t0)
    assert Group.objects.get(name="g1").rebalance_due_at is not None
    sweep_liveness(t0 + timedelta(seconds=0.5))
    assert rebalanced() == 0
    sweep_liveness(t0 + timedelta(seconds=1))
    g = Group.objects.get(name="g1")
    assert rebalanced() == 1
    assert g.rebalance_due_at is None
    assert g.assignment_epoch == g.group_epoch


@WINDOW
@pytest.mark.parametrize("snapshots", [True, False])
def test_r1b_slots_still_targeting_a_member_that_left_are_saved_by_its_row(hb: Hb, snapshots: bool):
    """A deferred leave leaves the member's target in place until the recompute; a slot of that
    target written meanwhile (here: released by the member revoking it) names the member that
    left, which the store maps back to its row."""
    t0 = timezone.now() - timedelta(seconds=20)
    with override_settings(RSC_GROUP_SNAPSHOTS=snapshots):
        snapshot_cache.forget_snapshots()
        beat("m0", 0, t0)
        out = beat("m0", 1, t0 + timedelta(seconds=1))
        owned = tuple(out["assignment"]["assignedShards"])
        beat("m1", 0, t0 + timedelta(seconds=5))  # a quiet group: recomputed at once
        out = beat("m0", out["memberEpoch"], t0 + timedelta(seconds=5.1), owned)
        revoking = out["assignment"]["revokingShards"]
        assert out["status"] == "REVOKE_PENDING"
        assert len(revoking) == 2
        left = response_body(heartbeat_service(
            "g1", HeartbeatRequest(member_id="m1", member_epoch=-1), t0 + timedelta(seconds=5.2)))
        assert left["memberEpoch"] == -1
        assert rebalanced() == 2
        from coordination.model import RevokeReport, RevokeState

        req = HeartbeatRequest(
            member_id="m0", member_epoch=out["memberEpoch"], metadata_epoch=1,
            owned_shards=tuple(s for s in owned if s not in revoking),
            revoking_shards=tuple(RevokeReport(s, RevokeState.REVOKED) for s in revoking),
        )
        result = heartbeat_service("g1", req, t0 + timedelta(seconds=5.3))
        assert result.response.error_code == "NONE"
        assert not result.response.assignment.revoking
        doc = describe_group("g1")
        assert doc["state"] == "ASSIGNING"
        out = beat("m0", result.response.member_epoch, t0 + timedelta(seconds=6.2),
                   tuple(result.response.assignment.assigned))
        assert sorted(out["assignment"]["assignedShards"]) == sorted(owned)
        assert rebalanced() == 3


@WINDOW
def test_r1b_only_writes_that_grant_wait_for_the_disk(hb: Hb):
    """A batched join grants nothing: its transaction commits without the WAL flush; a grant's
    transaction keeps the server's synchronous commit."""
    from django.db import connection, transaction

    from assignments.rows import load_state, lock_group
    from assignments.writer import save_state
    from coordination import engine

    def write(req: HeartbeatRequest, now: Any) -> str:
        with transaction.atomic():
            group = lock_group("g1")
            state, loaded = load_state(group, req.member_id)
            assert engine.heartbeat(state, req, now).error_code == "NONE"
            save_state(state, loaded, now)
            with connection.cursor() as cursor:
                cursor.execute("SHOW synchronous_commit")
                return cursor.fetchone()[0]

    t0 = timezone.now() - timedelta(seconds=10)
    assert write(HeartbeatRequest(member_id="m0", member_epoch=0), t0) == "off"
    granting = HeartbeatRequest(member_id="m0", member_epoch=1, metadata_epoch=1, owned_shards=())
    assert write(granting, t0 + timedelta(seconds=1)) == "on"
    assert len(describe_group("g1")["members"][0]["assignedShards"]) == 4
