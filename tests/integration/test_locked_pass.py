"""The locked pass against real PostgreSQL: its round trips, this process's gate per group, and
the snapshot a shared group read must not throw away (issue 11, join storms)."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assignments import fastpath, gates, rows, snapshot_cache
from assignments.models import ShardAssignment
from assignments.services import heartbeat as heartbeat_service
from coordination.model import HeartbeatRequest, RevokeReport
from groups.models import Event, Group
from groups.services import resolve_api_key
from members.models import Member

from .conftest import Hb, make_group

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
    assert writes.rstrip().endswith("COMMIT")  # the commit rides with the writes
    assert "assignments_shardassignment" in writes
    assert b.member_epoch > 0


def test_a_join_with_a_recompute_saves_its_row_before_the_slots_that_name_it(hb: Hb):
    """The new member's row and the slots that name it go in one round trip: the slot
    statement looks up the row id the upsert before it in the batch just made."""
    beat("a", 0)
    with CaptureQueriesContext(connection) as queries:
        joined = beat("b", 0)  # window 0 in tests: the target is recomputed at once, naming b's row
    inside = [q["sql"] for q in queries.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(inside) == 2, inside  # the lock with its reads; every write and the COMMIT
    assert "INSERT INTO members_member" in inside[1]
    assert "owner_name" in inside[1]
    assert len(joined.assignment.pending) == 2
    assert Event.objects.filter(group__name="g1", kind="joined", member_id="b").count() == 1
    assert ShardAssignment.objects.filter(group__name="g1", target__member_id="b").count() == 2


def behind_the_gate(group: str, waiter: Callable[[], None]) -> Any:
    """Run `waiter` in a thread while another thread holds `group`'s gate; check that it queues
    there, then release the gate. Returns when the gate was released."""
    held = threading.Event()
    release = threading.Event()
    released_at: list[Any] = []

    def holder() -> None:
        with gates.group_gate(group):
            held.set()
            release.wait(10)
            released_at.append(timezone.now())

    t1 = threading.Thread(target=holder)
    t1.start()
    assert held.wait(10)
    t2 = threading.Thread(target=waiter)
    t2.start()
    t2.join(0.2)
    assert t2.is_alive()  # queued behind the holder
    release.set()
    t1.join(10)
    t2.join(10)
    return released_at[0]


def test_a_request_waiting_for_its_groups_gate_holds_no_database_connection(db):
    """Requests of one worker queue on their group's gate; a waiter that kept a pooled
    connection could starve the holder of one (gevent workers have two "default" and four
    "liveness"): it hands back both."""
    seen: dict[str, Any] = {}

    def waiter() -> None:
        for alias in ("default", "liveness"):
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT 1")
        seen["before"] = all(connections[a].connection is not None for a in ("default", "liveness"))
        with gates.group_gate("g-gate"):
            seen["while_waiting_closed"] = all(connections[a].connection is None for a in ("default", "liveness"))
        connections.close_all()

    behind_the_gate("g-gate", waiter)
    assert seen == {"before": True, "while_waiting_closed": True}


def test_gate_without_waiting_yields_false_while_taken():
    with gates.group_gate("g-busy") as first:
        assert first is True
        outcome: list[bool] = []
        t = threading.Thread(target=lambda: outcome.append(gates.group_gate("g-busy", wait=False).__enter__()))
        t.start()
        t.join(10)
        assert outcome == [False]
    with gates.group_gate("g-busy", wait=False) as again:
        assert again is True


def test_a_snapshot_ahead_of_a_shared_group_read_is_kept(hb: Hb):
    """A steady heartbeat's group read may have started before the commit its snapshot already
    holds (reads are shared): the snapshot stays, the heartbeat takes the statement path."""
    beat("a", 0)
    group = Group.objects.select_related("stream").get(name="g1")
    snap = snapshot_cache._snapshots.get(group.pk)
    assert snap is not None
    shape = snapshot_cache.shape_of(group)
    assert snapshot_cache.steady_snapshot(group.pk, snap.version - 1, shape) is None
    assert snapshot_cache._snapshots.get(group.pk) is snap
    assert snapshot_cache.steady_snapshot(group.pk, snap.version + 1, shape) is None  # behind: kept too
    assert snapshot_cache._snapshots.get(group.pk) is snap
    found = snapshot_cache.steady_snapshot(group.pk, snap.version, shape)
    assert found is snap
    snapshot_cache.return_snapshot(group.pk, found)


@contextmanager
def pooled(alias: str) -> Iterator[Any]:
    """`alias` as gevent workers have it: a connection pool (settings: DB_POOL), here of one."""
    plain = connections[alias]
    settings_dict = {**plain.settings_dict, "CONN_MAX_AGE": 0,
                     "OPTIONS": {**plain.settings_dict["OPTIONS"], "pool": {"min_size": 1, "max_size": 1, "timeout": 2}}}
    wrapper = plain.__class__(settings_dict, alias)
    connections[alias] = wrapper
    try:
        yield wrapper
    finally:
        wrapper.close()
        wrapper.close_pool()
        connections[alias] = plain


def test_the_stamp_flush_before_a_locked_pass_hands_its_pooled_connection_back(db):
    """A locked heartbeat first writes this worker's pending stamps on "liveness", then may
    queue for the group's gate or a "default" connection. Kept, that connection joined a
    cycle in a storm of joins with a connection per member: gate waiters held "liveness",
    steady heartbeats held "default" waiting for "liveness", the gate holder waited for
    "default", until the pools' timeout, again and again."""
    with pooled("liveness") as liveness:
        with liveness.cursor() as cursor:  # e.g. the stamps this request wrote
            cursor.execute("SELECT 1")
        assert liveness.connection is not None
        fastpath.flush_stamps()
        assert liveness.connection is None
        assert liveness.pool.get_stats()["pool_available"] == 1  # back in the pool, not closed


def test_a_steady_heartbeat_on_pooled_connections_reads_through_the_pool_itself(hb: Hb):
    """Gevent workers: the steady path's group read takes a connection of the "liveness" pool
    directly (no Django connect per read) and gives it back at once; the answer is the core's."""
    a = beat("a", 0)
    req = HeartbeatRequest(member_id="a", member_epoch=a.member_epoch, metadata_epoch=1,
                           owned_shards=a.assignment.assigned)
    from django.db.backends.signals import connection_created

    connects: list[str] = []

    def connected(sender: Any, connection: Any, **kwargs: Any) -> None:
        connects.append(connection.alias)

    with pooled("liveness") as liveness:
        connection_created.connect(connected)
        try:
            result = heartbeat_service("g1", req, timezone.now())
        finally:
            connection_created.disconnect(connected)
        assert result.path == "fast"
        assert "liveness" not in connects  # Django's wrapper never connected
        assert liveness.connection is None
        stats = liveness.pool.get_stats()
        assert stats["requests_num"] >= 1  # the read went through the pool
        assert stats["pool_available"] == 1  # and its connection is back
        fastpath.flush_stamps()
    assert result.response.assignment.assigned == a.assignment.assigned


def test_a_key_lookup_hands_its_pooled_connection_back(db):
    """The first request of a worker looks its key up; it then may wait long (the gate, a
    shared read) and must not hold a "default" connection meanwhile."""
    with pooled("default") as default:
        assert resolve_api_key("rsc_no-such-key-" + "x" * 20) is None
        assert default.connection is None


def test_requests_missing_the_key_cache_together_look_the_key_up_once(hb: Hb, monkeypatch):
    """When a key's cached entry expires, a gevent worker may hold hundreds of its requests
    (a join storm, a connection per member): one looks it up, the others wait for its answer
    instead of each querying and queueing for one of the worker's two connections."""
    from groups import services as group_services

    real = group_services._load_key
    lookups: list[str] = []
    all_in = threading.Event()

    def counted(digest: str) -> Any:
        lookups.append(digest)
        if len(lookups) == 8:
            all_in.set()
        all_in.wait(1)  # without the single lookup, all eight are in here at once
        try:
            return real(digest)
        finally:
            connection.close()

    monkeypatch.setattr(group_services, "_load_key", counted)
    group_services.clear_key_cache()
    scopes: list[Any] = []
    threads = [threading.Thread(target=lambda: scopes.append(resolve_api_key(hb.fx.key))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(lookups) == 1
    assert len(scopes) == 8
    assert all(s is not None and s.group == "g1" for s in scopes)


def _join(group: str, member_id: str) -> Any:
    req = HeartbeatRequest(member_id=member_id, member_epoch=0, metadata_epoch=None)
    return heartbeat_service(group, req, timezone.now()).response


def test_r1_a_join_into_a_full_group_is_refused_before_the_lock(db):
    make_group(stream="s-full", group="full", max_members=2)
    for m in "ab":
        assert _join("full", m).error_code == "NONE"
    with CaptureQueriesContext(connection) as queries:
        refused = _join("full", "c")
    assert refused.error_code == "GROUP_MAX_SIZE_REACHED"
    sql = [q["sql"] for q in queries.captured_queries]
    assert len(sql) == 1, sql  # the counts only
    assert "FOR UPDATE" not in sql[0]


def test_r1_a_join_with_room_in_this_processs_snapshot_skips_the_count(db):
    """A storm of joins into a group far from maxMembers: no count statement per join."""
    make_group(stream="s-room", group="room", max_members=100)
    assert _join("room", "a").error_code == "NONE"  # leaves this process's snapshot
    with CaptureQueriesContext(connection) as queries:
        assert _join("room", "b").error_code == "NONE"
    assert not [q for q in queries.captured_queries if "count(" in q["sql"]]


def test_r1_a_join_into_the_last_free_seat_skips_the_count_and_the_next_is_counted(db):
    """The figure of this process leaves one seat: the join takes it without a count (a count
    would refuse nothing); the one after it finds no seat in the figure, is counted, and is
    refused before the lock."""
    make_group(stream="s-last", group="last", max_members=20)  # a tenth free was the old rule
    for i in range(19):
        assert _join("last", f"m{i}").error_code == "NONE"
    with CaptureQueriesContext(connection) as queries:
        assert _join("last", "m19").error_code == "NONE"
    assert not [q for q in queries.captured_queries if "count(" in q["sql"]]
    with CaptureQueriesContext(connection) as queries:
        assert _join("last", "m20").error_code == "GROUP_MAX_SIZE_REACHED"
    sql = [q["sql"] for q in queries.captured_queries]
    assert any("count(" in q for q in sql), sql
    assert not any("FOR UPDATE" in q for q in sql), sql


def test_r1_a_stale_snapshot_with_room_still_gets_the_cores_refusal(db):
    """The hint only skips the precheck: R1 under the lock refuses a join into a group that
    has filled (here: its maxMembers lowered) since this process's snapshot."""
    from groups.services import update_group_config

    make_group(stream="s-stale", group="stale", max_members=100)
    for m in "ab":
        assert _join("stale", m).error_code == "NONE"
    update_group_config("stale", actor="t", max_members=2)
    assert snapshot_cache.clearly_has_room("stale")  # the snapshot still says 100
    refused = _join("stale", "c")
    assert refused.error_code == "GROUP_MAX_SIZE_REACHED"
    assert not snapshot_cache.clearly_has_room("stale")  # the locked pass caught the snapshot up


def test_r1b_an_api_heartbeat_is_applied_at_the_time_it_gets_the_lock(hb: Hb):
    """Without an explicit `now` (the API) the locked path reads the clock once it holds the
    group's gate and lock, not on arrival: a storm's queued joins extend R1b's window while
    they apply, instead of each finding it long over and recomputing the target again."""
    beat("a", 0)

    def joiner() -> None:
        heartbeat_service("g1", HeartbeatRequest(member_id="b", member_epoch=0))
        connections.close_all()

    arrived = timezone.now()
    released_at = behind_the_gate("g1", joiner)
    b = Member.objects.get(group__name="g1", member_id="b")
    assert b.last_heartbeat_at >= released_at > arrived
    assert Group.objects.get(name="g1").rebalance_deferred_at is None  # window 0 in tests: recomputed


def _queue_behind_the_gate(group: str, requests: list[HeartbeatRequest]) -> dict[str, Any]:
    """Queue `requests` (a thread each) while another thread holds `group`'s gate, then let
    them through: what a gevent worker sees in a join storm. Returns member id → answer or
    the exception its request raised."""
    from assignments import services

    held, release = threading.Event(), threading.Event()
    out: dict[str, Any] = {}

    def holder() -> None:
        with gates.group_gate(group):
            held.set()
            release.wait(10)

    def send(req: HeartbeatRequest) -> None:
        try:
            out[req.member_id] = heartbeat_service(group, req).response
        except Exception as exc:  # recorded for the test to check
            out[req.member_id] = exc
        finally:
            connections.close_all()

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    senders = [threading.Thread(target=send, args=(req,)) for req in requests]
    for s in senders:
        s.start()
    deadline = time.monotonic() + 10
    while len(services._queues.get(group, ())) < len(requests):  # all queued for the gate
        assert time.monotonic() < deadline, "requests did not queue at the gate"
        time.sleep(0.01)
    release.set()
    for thread in (t, *senders):
        thread.join(10)
    return out


def test_group_commit_applies_the_heartbeats_queued_at_a_gate_in_one_locked_pass(hb: Hb):
    """Joins that queued while the gate was taken are applied by the next pass together: one
    new state version (one save, one commit) for all, each answered as if alone (R1: a joined
    member with its own epoch; window 0 in tests: each join recomputes the target)."""
    beat("a", 0)
    before = Group.objects.get(name="g1").state_version
    answers = _queue_behind_the_gate("g1", [HeartbeatRequest(member_id=m, member_epoch=0) for m in "bcd"])
    assert all(r.error_code == "NONE" for r in answers.values()), answers
    assert Group.objects.get(name="g1").state_version == before + 1
    epochs = sorted(r.member_epoch for r in answers.values())
    assert epochs == sorted(set(epochs))  # applied one after the other: distinct epochs
    assert epochs[0] > 1
    assert set(Member.objects.filter(group__name="g1").values_list("member_id", flat=True)) == set("abcd")
    assert Event.objects.filter(group__name="g1", kind="joined").count() == 4


def test_group_commit_a_heartbeat_that_fails_in_a_batch_fails_alone(hb: Hb, monkeypatch):
    """One request whose pass raises (here: the core, made to fail for member "x") takes
    nothing else down: the batch is rolled back and each heartbeat applied in a pass of its
    own; only "x" gets the error."""
    from assignments import services

    beat("a", 0)
    real = services.engine.heartbeat

    def failing(state: Any, req: HeartbeatRequest, now: Any) -> Any:
        if req.member_id == "x":
            raise RuntimeError("boom")
        return real(state, req, now)

    monkeypatch.setattr(services.engine, "heartbeat", failing)
    answers = _queue_behind_the_gate("g1", [HeartbeatRequest(member_id=m, member_epoch=0) for m in "bxc"])
    assert isinstance(answers["x"], RuntimeError)
    assert answers["b"].error_code == answers["c"].error_code == "NONE"
    assert set(Member.objects.filter(group__name="g1").values_list("member_id", flat=True)) == {"a", "b", "c"}


def _settled(group: str, member_id: str) -> tuple[int, int]:
    """A STABLE member of `group` (alone in it): (row id, memberEpoch)."""
    joined = heartbeat_service(group, HeartbeatRequest(member_id=member_id, member_epoch=0), timezone.now()).response
    req = HeartbeatRequest(member_id=member_id, member_epoch=joined.member_epoch, metadata_epoch=1,
                           owned_shards=joined.assignment.assigned)
    heartbeat_service(group, req, timezone.now())
    row = Member.objects.get(group__name=group, member_id=member_id)
    assert row.status == "STABLE"
    return row.pk, row.member_epoch


def _flush_until_it_waits(cursor: Any, table: str) -> threading.Thread:
    """Starts a stamp batch in another thread; returns once it waits for a row lock."""

    def flush() -> None:
        try:
            fastpath.STAMPS.flush()  # or the stamping thread, whichever takes the batch first
        finally:
            connections.close_all()

    t = threading.Thread(target=flush)
    t.start()
    deadline = time.monotonic() + 10
    while True:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # else one view per transaction
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                       " AND query LIKE %s", [f"%UPDATE {table}%"])
        if cursor.fetchone()[0]:
            return t
        assert time.monotonic() < deadline, "the stamp batch never waited for the row lock"
        time.sleep(0.01)


def test_a_stamp_batch_locks_member_rows_in_id_order(hb: Hb, caplog):
    """Two workers' batches over the same members must lock them in one order, or they
    deadlock (seen in the bench: PostgreSQL aborted one batch a second). Here another
    transaction holds the lower row: the batch, queued high → low, waits for it holding
    nothing, so the other transaction can still lock the higher row. Locking high first, the
    batch would hold it while it waits: a deadlock, which PostgreSQL breaks by aborting the
    batch (retried with the next)."""
    make_group(stream="s-order", group="order")
    low, low_epoch = _settled("g1", "a")
    high, high_epoch = _settled("order", "b")
    assert low < high
    fastpath.flush_stamps()
    stamped_at = timezone.now()
    table = Member._meta.db_table

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [low])
        fastpath.STAMPS.add(high, stamped_at, None, high_epoch)
        fastpath.STAMPS.add(low, stamped_at, None, low_epoch)
        t = _flush_until_it_waits(cursor, table)
        cursor.execute("SET LOCAL lock_timeout = '2s'")
        cursor.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [high])
    t.join(10)
    deadline = time.monotonic() + 10
    while True:  # the batch goes through once our transaction ends
        stamps = dict(Member.objects.filter(pk__in=[low, high]).values_list("pk", "last_heartbeat_at"))
        if stamps == {low: stamped_at, high: stamped_at}:
            break
        assert time.monotonic() < deadline, stamps
        time.sleep(0.01)
    # Written at the first try: locking high first, the batch would have been the deadlock's
    # victim (PostgreSQL's check runs first in the transaction that waited first) and retried.
    assert not [r for r in caplog.records if "stamps not written" in r.getMessage()]


def test_a_large_stamp_batch_locks_member_rows_in_id_order_whatever_the_plan(hb: Hb):
    """The order of the batch's JSON is not enough: past ~100 rows the planner hashes the
    batch and walks the member rows in their physical order instead (seen in the bench: a
    deadlock between two workers' batches of ~125 stamps). Here the lowest row has moved to
    the end of its page, behind rows of the batch with higher ids. Another transaction holds
    it: the batch must wait for it holding no other row, as locking in id order does."""
    make_group(stream="s-order", group="order")
    low, low_epoch = _settled("g1", "a")
    table = Member._meta.db_table
    with connection.cursor() as cursor:
        # Packed as a new table's rows are: the suite's flush deletes small tables' rows, and
        # their free space would take the rows below (and the lowest row's new version) anywhere.
        cursor.execute(f"VACUUM FULL {table}")
    group = Group.objects.get(name="order")
    Member.objects.bulk_create(  # members of their own: rows, not heartbeats, are what this is about
        [Member(group=group, member_id=f"bulk-{i}", status="STABLE") for i in range(200)])
    bulk = list(Member.objects.filter(group=group).values_list("pk", "member_epoch"))
    with connection.cursor() as cursor:  # a new version of the lowest row, later in the table
        cursor.execute(f"UPDATE {table} SET client_id = client_id WHERE id = %s", [low])
        # With the statistics of a settled group, the planner expects the batch's members to
        # outnumber its rows and walks the members, in their physical order.
        cursor.execute(f"ANALYZE {table}")
        cursor.execute(f"SELECT ctid FROM {table} WHERE id = %s", [low])
        (low_ctid,) = cursor.fetchone()
        cursor.execute(f"SELECT count(*) FROM {table} WHERE id = ANY(%s) AND ctid < %s",
                       [[pk for pk, _ in bulk], low_ctid])
        assert cursor.fetchone()[0] > 0  # rows of the batch now lie before it
    fastpath.flush_stamps()
    stamped_at = timezone.now()

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [low])
        for pk, epoch in bulk:
            fastpath.STAMPS.add(pk, stamped_at, None, epoch)
        fastpath.STAMPS.add(low, stamped_at, None, low_epoch)
        t = _flush_until_it_waits(cursor, table)
        # Every other row of the batch is free: the batch locked none of them first.
        cursor.execute(f"SELECT count(*) FROM (SELECT id FROM {table} WHERE id = ANY(%s)"
                       f" FOR UPDATE SKIP LOCKED) AS free", [[pk for pk, _ in bulk]])
        assert cursor.fetchone()[0] == len(bulk)
    t.join(10)
    assert not t.is_alive()
    assert set(Member.objects.filter(group=group).values_list("last_heartbeat_at", flat=True)) == {stamped_at}


def test_group_commit_a_database_outage_fails_the_batch_at_once(hb: Hb, monkeypatch):
    """With the database unavailable, the heartbeats of a batch all get the error from the one
    pass (503 for each, they retry), not one pass each in turn while the gate is held."""
    from django.db import OperationalError

    from assignments import services

    beat("a", 0)
    passes: list[tuple[str, ...]] = []

    def unavailable(group_name: str, member_ids: Any) -> Any:
        passes.append(member_ids)
        raise OperationalError("connection refused")

    monkeypatch.setattr(services, "lock_and_load", unavailable)
    answers = _queue_behind_the_gate("g1", [HeartbeatRequest(member_id=m, member_epoch=0) for m in "bcd"])
    assert all(isinstance(answers[m], OperationalError) for m in "bcd"), answers
    assert len(passes) == 1, passes


def test_i23_4_a_steady_heartbeats_new_report_is_in_the_database_before_its_answer(hb: Hb, monkeypatch):
    """R3 across processes: a locked heartbeat on another host at the previous epoch with
    ownedShards omitted reads the member's last report from its row. A steady answer given
    from this process's snapshot with a report it had not seen on this state writes the report
    before answering; only last-seen waits for the batch."""
    a = beat("a", 0)
    granted = a.assignment.assigned
    assert len(granted) >= 2
    fastpath.STAMPS.stop()  # no batch thread running now; the next one waits a minute
    monkeypatch.setattr(fastpath, "STAMP_PERIOD", 60.0)
    try:
        for owned in ((), granted[:1], granted):
            req = HeartbeatRequest(member_id="a", member_epoch=a.member_epoch, metadata_epoch=1,
                                   owned_shards=tuple(owned))
            result = heartbeat_service("g1", req, timezone.now())
            assert result.path == "fast"
            # What another host's locked pass would load (a fresh read of the row).
            with transaction.atomic():
                group = rows.lock_group("g1")
                state, _ = rows.load_state(group, "a")
            assert state.members["a"].last_reported_owned == tuple(owned)
        # The same report again is a memo hit: only last-seen is batched.
        heartbeat_service("g1", req, timezone.now())
        assert len(fastpath.STAMPS._pending) == 1
    finally:
        fastpath.STAMPS.stop()  # the next batch thread starts with the usual period


def test_i26_2_a_steady_heartbeat_older_than_the_rows_stamp_is_answered_without_the_lock(hb: Hb, monkeypatch):
    """Two requests of one member on two processes: the one that arrived first may stamp
    second. Its row then holds the newer stamp, which is all the older request would write:
    it is answered on the steady path, and moves neither last-seen back nor state_version (a
    locked pass there emptied every process's snapshot: at 10,000 members the steady path
    never warmed). A member no longer STABLE at that epoch still goes to the locked path."""
    a = beat("a", 0)
    fastpath.STAMPS.stop()
    monkeypatch.setattr(fastpath, "STAMP_PERIOD", 60.0)
    try:
        arrived = timezone.now()
        newer = arrived + timezone.timedelta(seconds=1)
        Member.objects.filter(group__name="g1", member_id="a").update(last_heartbeat_at=newer)  # the other process's stamp
        version = Group.objects.get(name="g1").state_version
        req = HeartbeatRequest(member_id="a", member_epoch=a.member_epoch, metadata_epoch=1,
                               owned_shards=a.assignment.assigned)
        result = heartbeat_service("g1", req, arrived)
        assert result.path == "fast"
        assert result.response.assignment.assigned == a.assignment.assigned
        assert Group.objects.get(name="g1").state_version == version
        assert Member.objects.get(group__name="g1", member_id="a").last_heartbeat_at == newer
        # A fence won meanwhile (the row is not STABLE at that epoch): the locked path decides.
        Member.objects.filter(group__name="g1", member_id="a").update(member_epoch=a.member_epoch + 7)
        again = HeartbeatRequest(member_id="a", member_epoch=a.member_epoch, metadata_epoch=1, owned_shards=())
        assert heartbeat_service("g1", again, arrived).path != "fast"
    finally:
        fastpath.STAMPS.stop()


def test_i26_2_a_slow_locked_pass_is_logged_with_its_parts(hb: Hb, monkeypatch, caplog):
    """Issue 26.2: a locked pass longer than SLOW_PASS_S is logged with where its time went
    (lock and load, core, save and commit), so a storm's stalls can be told apart from its
    request count; a pass within the bound logs nothing."""
    from assignments import services

    with caplog.at_level("WARNING", logger="coordinator.heartbeat"):
        beat("a", 0)
    assert not [r for r in caplog.records if "slow locked pass" in r.getMessage()]
    monkeypatch.setattr(services, "SLOW_PASS_S", 0.0)
    with caplog.at_level("WARNING", logger="coordinator.heartbeat"):
        beat("b", 0)
    slow = [r.getMessage() for r in caplog.records if "slow locked pass" in r.getMessage()]
    assert len(slow) == 1, slow
    assert "for 1 heartbeats (lock and load" in slow[0], slow[0]
    assert "save and commit" in slow[0], slow[0]


def test_i26_r3_a_first_answer_whose_report_the_row_holds_writes_nothing_at_once(hb: Hb, monkeypatch):
    """After a join storm each member's grant report was written by the process that answered
    it first; every other process's first answer to it would write it again (issue 26). One
    read of the group's reports (HELD_REPORTS) spares those writes, and only those: a report
    the row does not hold is still written before its answer (R3 across processes), and a
    locked write (a new state_version) makes what was read useless."""
    a = beat("a", 0)
    granted = tuple(a.assignment.assigned)
    assert len(granted) >= 2
    fastpath.STAMPS.stop()
    monkeypatch.setattr(fastpath, "STAMP_PERIOD", 60.0)
    # Read at the first miss of a version (the service reads after 64, once settled 1 s).
    monkeypatch.setattr(fastpath, "HELD_MISSES", 1)
    monkeypatch.setattr(fastpath, "HELD_SETTLED_S", 0.0)
    monkeypatch.setattr(fastpath, "HELD_READ_EVERY_S", 0.0)
    group_pk = Group.objects.get(name="g1").pk

    def first_answer(owned: tuple[str, ...]) -> list[str]:
        """The liveness statements of a steady answer this process has not memoized (as on
        another process that did not answer the report before)."""
        snapshot_cache._snapshots[group_pk].steady.clear()
        req = HeartbeatRequest(member_id="a", member_epoch=a.member_epoch, metadata_epoch=1, owned_shards=owned)
        with CaptureQueriesContext(connections["liveness"]) as queries:
            assert heartbeat_service("g1", req, timezone.now()).path == "fast"
        return [q["sql"] for q in queries.captured_queries]

    def stored() -> tuple[str, ...] | None:
        with transaction.atomic():  # what another host's locked pass loads
            state, _ = rows.load_state(rows.lock_group("g1"), "a")
        return state.members["a"].last_reported_owned

    try:
        beat("a", a.member_epoch, owned_shards=granted)  # the first process writes the report
        assert stored() == granted
        sql = first_answer(granted)
        assert not [s for s in sql if "UPDATE" in s], sql  # the row holds it: last-seen is batched
        assert len(fastpath.STAMPS._pending) == 1
        reads = fastpath.HELD_REPORTS.reads
        assert reads >= 1
        # A report the row does not hold is written before the answer goes out.
        sql = first_answer(granted[:1])
        assert [s for s in sql if "UPDATE" in s], sql
        assert stored() == granted[:1]
        # A locked write raises state_version: what was read belongs to the old version.
        beat("b", 0)
        version = Group.objects.get(name="g1").state_version
        assert fastpath.HELD_REPORTS._current(group_pk, version).rows == {}
    finally:
        fastpath.STAMPS.stop()


def test_i26_r3_reports_written_at_once_share_one_statement_that_checks_each_member(hb: Hb):
    """The stamps steady heartbeats write before answering go in one statement per batch
    (fastpath._ReportWrites): on PostgreSQL it writes each member that is STABLE at its
    stamp's epoch, returns each STABLE member's epoch, writes nothing else, and skips a row
    another transaction holds instead of waiting for it."""
    a = beat("a", 0)
    b = beat("b", 0)
    a = beat("a", a.member_epoch, owned_shards=a.assignment.assigned)
    revoked = tuple(RevokeReport(shard=s, state="REVOKED") for s in a.assignment.revoking)
    a = beat("a", a.member_epoch, owned_shards=a.assignment.assigned, revoking_shards=revoked)
    b = beat("b", b.member_epoch)
    assert Member.objects.get(member_id="a").status == Member.objects.get(member_id="b").status == "STABLE"
    c = beat("c", 0)  # c is not STABLE (it waits for shards): its stamp is not written
    assert Member.objects.get(member_id="c").status != "STABLE"
    pk = {m.member_id: m.pk for m in Member.objects.filter(group__name="g1")}
    before = {m.member_id: m.last_heartbeat_at for m in Member.objects.filter(group__name="g1")}
    later = timezone.now()
    a_report = '["' + a.assignment.assigned[0] + '"]'
    stamps = {
        pk["a"]: (later, a_report, a.member_epoch),
        pk["b"]: (later, '["x"]', b.member_epoch + 1),  # an epoch the member is not at
        pk["c"]: (later, None, c.member_epoch),
    }
    with transaction.atomic():  # another transaction holds a's row (a locked pass writing it)
        Member.objects.select_for_update(no_key=True).get(pk=pk["a"])
        assert fastpath._write_now(stamps, True) == {pk["b"]: b.member_epoch}  # a skipped, not waited for
    assert Member.objects.get(pk=pk["a"]).last_heartbeat_at == before["a"]
    held = fastpath._write_now(stamps, True)
    assert held == {pk["a"]: a.member_epoch, pk["b"]: b.member_epoch}  # c: not STABLE
    rows_after = {m.member_id: m for m in Member.objects.filter(group__name="g1")}
    assert rows_after["a"].last_heartbeat_at == later
    assert rows_after["a"].last_reported_owned == [a.assignment.assigned[0]]
    assert rows_after["b"].last_heartbeat_at == before["b"]  # not its epoch: untouched
    assert rows_after["b"].last_reported_owned != ["x"]
    assert rows_after["c"].last_heartbeat_at == before["c"]
