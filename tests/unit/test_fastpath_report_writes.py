"""Issue 26 (the phase right after a join storm): the stamps a steady heartbeat must write
before its answer goes out (R3: its report may be new) are written in one statement for the
heartbeats of a process that wait at the same time, and each answer still waits for a
statement that holds its own stamp. Pure concurrency logic of `_ReportWrites`: the statement
is a stand-in that records its rows and blocks on events."""
from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from assignments import fastpath
from assignments.fastpath import _ABANDONED, _ReportWrites
from tests.polling import until as _until

T0 = datetime(2026, 12, 6, tzinfo=UTC)


def _known_written(member_pk: int, at: datetime = T0) -> bool:
    """What `STAMPS.recent`, the one reader of the stamps noted as written, says: that the
    database holds this member's last-seen of `at` or later (its horizon is `at` here)."""
    return fastpath.STAMPS.recent(member_pk, None, at + timedelta(seconds=5), session_ms=10_000)
Rows = dict[int, tuple[datetime, str | None, int]]



class _Database:
    """Each statement records its rows, blocks until released, and answers every member STABLE
    at epoch 3 (the epoch the tests' heartbeats send, but where a test says otherwise)."""

    def __init__(self, epochs: dict[int, int] | None = None, locked: frozenset[int] = frozenset()) -> None:
        self.statements: list[Rows] = []
        self.shared: list[bool] = []
        self.release = [threading.Event() for _ in range(5)]
        self.epochs = epochs or {}
        self.locked = locked  # rows another transaction holds: a shared statement skips them

    def execute(self, rows: Rows, shared: bool) -> dict[int, int]:
        self.statements.append(dict(rows))
        self.shared.append(shared)
        assert self.release[len(self.statements) - 1].wait(10)
        return {pk: self.epochs.get(pk, 3) for pk in rows if not (shared and pk in self.locked)}


@pytest.fixture(autouse=True)
def _no_pending_stamps():
    fastpath.STAMPS.drop()
    yield
    fastpath.STAMPS.drop()


def _behind_a_running_statement(db: _Database, writes: _ReportWrites, heartbeat: Callable[[int], None],
                                first: int, later: tuple[int, ...]) -> list[threading.Thread]:
    """`first`'s heartbeat leads a statement the database holds; then `later`'s heartbeats
    arrive and join the next one. Their threads, started."""
    threads = [threading.Thread(target=heartbeat, args=(first,))]
    threads[0].start()
    _until(lambda: len(db.statements) == 1, "the first statement to start")
    for pk in later:
        threads.append(threading.Thread(target=heartbeat, args=(pk,)))
        threads[-1].start()
    _until(lambda: writes._next is not None and len(writes._next.rows) == len(later),
           "the later ones to join the next statement")
    return threads


def test_i26_r3_stamps_arriving_during_a_write_share_the_next_one_and_each_waits_for_its_own():
    db = _Database()
    writes = _ReportWrites(db.execute)
    answers: dict[int, bool] = {}

    def heartbeat(pk: int) -> None:
        answers[pk] = writes.write(pk, T0 + timedelta(milliseconds=pk), f'["s-{pk}"]', 3)

    first, *late = _behind_a_running_statement(db, writes, heartbeat, 1, (2, 3))
    assert len(db.statements) == 1  # nothing else starts while statement 1 runs
    assert answers == {}  # and nobody is answered before the statement holding its stamp ends
    db.release[0].set()
    first.join(10)
    assert answers == {1: True}
    _until(lambda: len(db.statements) == 2, "the next statement to start")
    assert answers == {1: True}  # 2 and 3 wait for theirs, not for statement 1
    db.release[1].set()
    for t in late:
        t.join(10)
    assert answers == {1: True, 2: True, 3: True}
    assert [sorted(s) for s in db.statements] == [[1], [2, 3]]  # the two late ones: one statement
    assert db.shared == [False, True]
    assert db.statements[1][2] == (T0 + timedelta(milliseconds=2), '["s-2"]', 3)
    assert _known_written(2, T0 + timedelta(milliseconds=2))  # noted as written: the newer stamp


def test_i26_r3_a_member_no_longer_stable_at_its_epoch_is_not_written_and_others_are():
    db = _Database(epochs={2: 4})  # member 2 moved to epoch 4 meanwhile (a locked write)
    for event in db.release:
        event.set()
    writes = _ReportWrites(db.execute)
    assert writes.write(1, T0, None, 3) is True
    assert writes.write(2, T0, '["s-2"]', 3) is False  # the caller lets the locked path answer
    gone = _ReportWrites(lambda rows, shared: {})  # not STABLE any more: no row
    assert gone.write(1, T0, None, 3) is False


def test_i26_r3_two_stamps_of_one_member_in_a_statement_write_the_newer():
    db = _Database()
    writes = _ReportWrites(db.execute)
    results: list[bool] = []
    blocker = threading.Thread(target=lambda: results.append(writes.write(9, T0, None, 3)))
    blocker.start()
    _until(lambda: len(db.statements) == 1, "a statement in flight")
    older = threading.Thread(target=lambda: results.append(writes.write(1, T0, '["old"]', 3)))
    older.start()
    _until(lambda: writes._next is not None and 1 in writes._next.rows, "the first stamp to join")
    newer = threading.Thread(target=lambda: results.append(writes.write(1, T0 + timedelta(seconds=1), '["new"]', 3)))
    newer.start()
    _until(lambda: writes._next is not None and writes._next.rows[1][1] == '["new"]', "the newer stamp")
    for event in db.release[:2]:
        event.set()
    for t in (blocker, older, newer):
        t.join(10)
    assert db.statements[1] == {1: (T0 + timedelta(seconds=1), '["new"]', 3)}
    assert results == [True, True, True]


def test_i26_r3_a_failed_statement_leaves_every_stamp_to_the_batch():
    """As before batching: a database error is logged, the stamps go with the next batch, and
    the heartbeats are answered (the locked path would fail on the same database)."""
    from django.db import DatabaseError

    def execute(rows: Rows, shared: bool) -> dict[int, int]:
        raise DatabaseError("connection lost")

    writes = _ReportWrites(execute)
    assert writes.write(7, T0, '["s-7"]', 3) is True
    assert fastpath.STAMPS._pending[7] == (T0, '["s-7"]', 3)
    assert not _known_written(7)  # pending, not written: a later answer writes first
    assert writes._next is None
    assert writes._running is None


def test_i26_r3_a_leader_dropped_before_writing_lets_its_joiners_write_again():
    """The request deadline (wsgi_guard) raises into a leader anywhere: a statement it led but
    did not start must still end, and the heartbeats that joined it write in another."""
    db = _Database()
    writes = _ReportWrites(db.execute)
    results: dict[int, bool] = {}
    blocker = threading.Thread(target=lambda: results.__setitem__(9, writes.write(9, T0, None, 3)))
    blocker.start()
    _until(lambda: len(db.statements) == 1, "a statement in flight")
    write = fastpath._Write()
    with writes._lock:
        writes._next = write
        write.rows[1] = (T0, '["s-1"]', 3)
    joiner = threading.Thread(target=lambda: results.__setitem__(1, writes.write(2, T0, None, 3)))
    joiner.start()
    _until(lambda: len(write.rows) == 2, "a joiner of the dropped leader's statement")
    with writes._lock:  # what _lead does when the deadline hits it before the statement starts
        writes._next = None
    write.error = _ABANDONED
    write.done.set()
    for event in db.release[:2]:
        event.set()
    for t in (blocker, joiner):
        t.join(10)
    assert results == {9: True, 1: True}
    assert sorted(db.statements[1]) == [2]  # the joiner wrote its own stamp in a new statement


def test_i26_r3_a_member_whose_row_the_shared_statement_skipped_is_written_alone():
    """The shared statement skips rows another transaction holds (a locked pass writing that
    member), so its heartbeats never queue behind a lock (decision 0018); the skipped member's
    heartbeat then writes alone, waiting for its row, as before the statements were shared."""
    db = _Database(locked=frozenset({2}))
    writes = _ReportWrites(db.execute)
    results: dict[int, bool] = {}

    def heartbeat(pk: int) -> None:
        results[pk] = writes.write(pk, T0, f'["s-{pk}"]', 3)

    threads = _behind_a_running_statement(db, writes, heartbeat, 9, (1, 2))
    for event in db.release[:3]:
        event.set()
    for t in threads:
        t.join(10)
    assert results == {9: True, 1: True, 2: True}
    assert [sorted(rows) for rows in db.statements] == [[9], [1, 2], [2]]
    assert db.shared == [False, True, False]  # the skipped member: its own statement, which waits


def test_i26_r3_a_skipped_member_whose_own_statement_fails_is_left_pending_not_written():
    """The same for the statement a skipped member writes alone: answered, its stamp pending
    for the batch, and not counted as written (STAMPS.recent lets later answers batch only
    what the database is known to hold)."""
    from django.db import DatabaseError

    db = _Database(locked=frozenset({2}))

    def execute(rows: Rows, shared: bool) -> dict[int, int]:
        if not shared and set(rows) == {2}:
            raise DatabaseError("connection lost")
        return db.execute(rows, shared)

    writes = _ReportWrites(execute)
    results: dict[int, bool] = {}

    def heartbeat(pk: int) -> None:
        results[pk] = writes.write(pk, T0, f'["s-{pk}"]', 3)

    threads = _behind_a_running_statement(db, writes, heartbeat, 9, (1, 2))
    for event in db.release:
        event.set()
    for t in threads:
        t.join(10)
    assert results == {9: True, 1: True, 2: True}
    assert [sorted(rows) for rows in db.statements] == [[9], [1, 2]]  # 2's own statement failed
    assert fastpath.STAMPS._pending[2] == (T0, '["s-2"]', 3)
    assert not _known_written(2)
    assert _known_written(1)
