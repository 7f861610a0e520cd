"""Issue 26.2: the stamps that steady answers write before they go out (R3) are coalesced per
process: a stamp joins the batch not started yet, whose leader waits for the batch being
written. Pure concurrency logic of `_StampsNow`; the write is a stand-in that blocks on events
and answers which members are STABLE at their epochs."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest

from assignments.fastpath import _StampsNow

T0 = datetime(2026, 12, 5, tzinfo=timezone.utc)
Rows = dict[int, tuple[datetime, str | None, int]]


def _until(predicate: Callable[[], bool], what: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class _Database:
    """Each write records its rows, blocks until released, then answers the STABLE ones."""

    def __init__(self, not_stable: frozenset[int] = frozenset(), fail: int = 0) -> None:
        self.writes: list[Rows] = []
        self.release = [threading.Event() for _ in range(5)]
        self.not_stable = not_stable
        self.fail = fail  # this write (1-based) fails as a database error would

    def write(self, rows: Rows) -> set[int]:
        self.writes.append(dict(rows))
        number = len(self.writes)
        assert self.release[number - 1].wait(10)
        if number == self.fail:
            raise RuntimeError("connection lost")
        return set(rows) - self.not_stable


def _stamp(stamps: _StampsNow, pk: int, out: dict[int, object], at: datetime = T0) -> threading.Thread:
    def run() -> None:
        try:
            out[pk] = stamps.stamp(pk, (at, "[]", 3))
        except BaseException as exc:  # the test reads what ended it
            out[pk] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_i26_2_stamps_arriving_during_a_write_share_the_next_one():
    db = _Database(not_stable=frozenset({13}))
    stamps = _StampsNow(db.write)
    out: dict[int, object] = {}
    first = _stamp(stamps, 10, out)
    _until(lambda: len(db.writes) == 1, "the first write to start")
    late = [_stamp(stamps, pk, out) for pk in (11, 12, 13)]
    _until(lambda: stamps._next is not None and len(stamps._next.rows) == 3, "three stamps to wait")
    assert len(db.writes) == 1  # nothing else is written while the first write runs
    db.release[0].set()
    first.join(10)
    _until(lambda: len(db.writes) == 2, "the next write")
    db.release[1].set()
    for t in late:
        t.join(10)
    assert [sorted(w) for w in db.writes] == [[10], [11, 12, 13]]  # three stamps, one statement
    assert out == {10: True, 11: True, 12: True, 13: False}  # 13: not STABLE at its epoch


def test_i26_2_a_failed_write_fails_every_stamp_of_its_batch_and_the_next_is_fresh():
    db = _Database(fail=2)
    stamps = _StampsNow(db.write)
    out: dict[int, object] = {}
    first = _stamp(stamps, 1, out)
    _until(lambda: len(db.writes) == 1, "the first write")
    late = [_stamp(stamps, pk, out) for pk in (2, 3)]
    _until(lambda: stamps._next is not None and len(stamps._next.rows) == 2, "two stamps to wait")
    db.release[0].set()
    db.release[1].set()
    for t in (first, *late):
        t.join(10)
    assert out[1] is True
    assert isinstance(out[2], RuntimeError)
    assert isinstance(out[3], RuntimeError)
    db.release[2].set()
    assert stamps.stamp(4, (T0, None, 3)) is True
    assert sorted(db.writes[-1]) == [4]


def test_i26_2_one_member_twice_in_a_batch_writes_its_newer_stamp_for_both():
    db = _Database()
    stamps = _StampsNow(db.write)
    out: dict[int, object] = {}
    first = _stamp(stamps, 1, out)
    _until(lambda: len(db.writes) == 1, "the first write")
    newer = _stamp(stamps, 7, {}, at=T0 + timedelta(seconds=1))
    _until(lambda: stamps._next is not None and 7 in stamps._next.rows, "the newer stamp to wait")
    older = _stamp(stamps, 7, out, at=T0)
    _until(lambda: stamps._next is not None and stamps._next.joined == 2, "the older stamp to join")
    for event in db.release:
        event.set()
    for t in (first, newer, older):
        t.join(10)
    assert db.writes[1] == {7: (T0 + timedelta(seconds=1), "[]", 3)}
    assert out[7] is True


class _Dropped(BaseException):
    """Stands in for wsgi_guard's deadline, raised into a request wherever it waits."""


def test_i26_2_stamps_sharing_a_write_whose_leader_is_dropped_stamp_again():
    """B leads the write after A's, C shares it; B is dropped mid-write. Whether B's write
    committed is unknown, so C (which must answer only once its row is written) stamps again."""
    calls: list[Rows] = []
    release = [threading.Event(), threading.Event()]

    def write(rows: Rows) -> set[int]:
        calls.append(dict(rows))
        n = len(calls)
        if n <= 2:
            assert release[n - 1].wait(10)
        if n == 2:
            raise _Dropped
        return set(rows)

    stamps = _StampsNow(write)
    out: dict[int, object] = {}
    a = _stamp(stamps, 1, out)
    _until(lambda: len(calls) == 1, "A's write")
    b = _stamp(stamps, 2, out)
    _until(lambda: stamps._next is not None, "B to lead the next write")
    c = _stamp(stamps, 3, out)
    _until(lambda: stamps._next is not None and len(stamps._next.rows) == 2, "C to share B's write")
    release[0].set()
    _until(lambda: len(calls) == 2, "B's write")
    release[1].set()
    for t in (a, b, c):
        t.join(5)
    assert out[1] is True
    assert isinstance(out[2], _Dropped)
    assert out[3] is True
    assert sorted(calls[2]) == [3]  # C's own stamp, written again


@pytest.mark.parametrize("cooperative", [False, True])
def test_i26_2_a_lone_stamp_is_written_at_once(cooperative: bool):
    db = _Database()
    for event in db.release:
        event.set()
    stamps = _StampsNow(db.write)
    stamps.configure(cooperative=cooperative)
    assert stamps.stamp(5, (T0, None, 1)) is True
    assert db.writes == [{5: (T0, None, 1)}]
    assert stamps._next is None
    assert stamps._running is None
