"""The locked pass against real PostgreSQL: its round trips, this process's gate per group, and
the snapshot a shared group read must not throw away (issue 11, join storms)."""
from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assignments import store
from assignments.models import ShardAssignment
from assignments.services import heartbeat as heartbeat_service
from coordination.model import HeartbeatRequest, RevokeReport
from groups.models import Event, Group

from .conftest import Hb

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]


def beat(member_id: str, epoch: int, **fields: Any) -> Any:
    req = HeartbeatRequest(member_id=member_id, member_epoch=epoch, metadata_epoch=1, **fields)
    result = heartbeat_service("g1", req, timezone.now())
    assert result.response.error_code == "NONE", result.response
    return result.response


def test_a_locked_heartbeat_is_two_statements_lock_with_reads_then_writes(hb: Hb):
    """With this process's snapshot at hand, a locked heartbeat sends the lock together with
    the reads that catch the snapshot up, then every write at once: two executes inside the
    transaction (one round trip each), whatever the core changed."""
    a = beat("a", 0)
    b = beat("b", 0)  # a must now give up half of its shards
    a2 = beat("a", a.member_epoch, owned_shards=a.assignment.assigned)
    assert a2.assignment.revoking
    revoked = tuple(RevokeReport(shard=s, state="REVOKED") for s in a2.assignment.revoking)
    with CaptureQueriesContext(connection) as queries:
        beat("a", a2.member_epoch, owned_shards=a2.assignment.assigned, revoking_shards=revoked)
    sql = [q["sql"] for q in queries.captured_queries]
    inside = [q for q in sql if q not in ("BEGIN", "COMMIT")]
    assert len(inside) == 2, sql
    lock, writes = inside
    assert "FOR UPDATE OF g" in lock
    assert "state_version >" in lock  # the catch-up reads ride with the lock
    assert "UPDATE" in writes
    assert "assignments_shardassignment" in writes
    assert b.member_epoch > 0


def test_a_join_with_a_recompute_saves_its_row_before_the_slots_that_name_it(hb: Hb):
    beat("a", 0)
    joined = beat("b", 0)  # window 0 in tests: the target is recomputed at once, naming b's row
    assert len(joined.assignment.pending) == 2
    assert Event.objects.filter(group__name="g1", kind="joined", member_id="b").count() == 1
    assert ShardAssignment.objects.filter(group__name="g1", target__member_id="b").count() == 2


def test_a_request_waiting_for_its_groups_gate_holds_no_database_connection(db):
    """Requests of one worker queue on their group's gate; a waiter that kept its pooled
    connection could starve the holder of one (gevent workers have two): it hands it back."""
    held = threading.Event()
    release = threading.Event()
    seen: dict[str, Any] = {}

    def holder() -> None:
        with store.group_gate("g-gate"):
            held.set()
            release.wait(10)

    def waiter() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        seen["before"] = connection.connection is not None
        with store.group_gate("g-gate"):
            seen["while_waiting_closed"] = connection.connection is None
        connection.close()

    t1 = threading.Thread(target=holder)
    t1.start()
    assert held.wait(10)
    t2 = threading.Thread(target=waiter)
    t2.start()
    t2.join(0.2)
    assert t2.is_alive()  # waits for the holder
    release.set()
    t1.join(10)
    t2.join(10)
    assert seen == {"before": True, "while_waiting_closed": True}


def test_gate_without_waiting_yields_false_while_taken():
    with store.group_gate("g-busy") as first:
        assert first is True
        outcome: list[bool] = []
        t = threading.Thread(target=lambda: outcome.append(store.group_gate("g-busy", wait=False).__enter__()))
        t.start()
        t.join(10)
        assert outcome == [False]
    with store.group_gate("g-busy", wait=False) as again:
        assert again is True


def test_a_snapshot_ahead_of_a_shared_group_read_is_kept(hb: Hb):
    """A steady heartbeat's group read may have started before the commit its snapshot already
    holds (reads are shared): the snapshot stays, the heartbeat takes the statement path."""
    beat("a", 0)
    group = Group.objects.select_related("stream").get(name="g1")
    snap = store._snapshots.get(group.pk)
    assert snap is not None
    shape = store._shape(group)
    assert store.steady_snapshot(group.pk, snap.version - 1, shape) is None
    assert store._snapshots.get(group.pk) is snap
    assert store.steady_snapshot(group.pk, snap.version + 1, shape) is None  # behind: kept too
    assert store._snapshots.get(group.pk) is snap
    found = store.steady_snapshot(group.pk, snap.version, shape)
    assert found is snap
    store.return_snapshot(group.pk, found)
