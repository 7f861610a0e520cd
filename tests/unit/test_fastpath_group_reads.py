"""Issue 11.4: steady heartbeats of one process share reads of the group row, and each uses a
read that started after it arrived (so it sees every write committed before it arrived).
Pure concurrency logic of `_GroupReads`: the row read is a stand-in that blocks on events."""
from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from assignments.fastpath import _GroupReads
from tests.polling import until as _until


class _Database:
    """A stand-in for the row read: each fetch gets the next number and blocks until released."""

    def __init__(self) -> None:
        self.started = 0
        self.release = [threading.Event() for _ in range(5)]

    def fetch(self, group: str) -> tuple:
        self.started += 1
        number = self.started
        assert self.release[number - 1].wait(10)
        return (group, number)


def test_heartbeat_arriving_during_a_read_uses_the_next_read_and_shares_it():
    db = _Database()
    reads = _GroupReads(db.fetch)
    answers: dict[str, tuple | None] = {}

    def heartbeat(name: str) -> None:
        answers[name] = reads.read("g")

    first = threading.Thread(target=heartbeat, args=("first",))
    first.start()
    _until(lambda: db.started == 1, "the first read to start")
    # Two heartbeats arrive while read 1 is in flight: it may predate a write they must see.
    late = [threading.Thread(target=heartbeat, args=(name,)) for name in ("second", "third")]
    for t in late:
        t.start()
    _until(lambda: "g" in reads._next and reads._next["g"].joined == 2, "both to wait for the next read")
    assert db.started == 1  # nothing else starts while read 1 runs
    db.release[0].set()
    first.join(10)
    _until(lambda: db.started == 2, "the next read to start")
    db.release[1].set()
    for t in late:
        t.join(10)
    assert answers == {"first": ("g", 1), "second": ("g", 2), "third": ("g", 2)}
    assert db.started == 2  # the two late heartbeats shared one read


def test_a_failed_read_fails_every_heartbeat_that_shared_it_and_the_next_read_is_fresh():
    calls = []

    def fetch(group: str) -> tuple:
        calls.append(group)
        if len(calls) == 1:
            raise RuntimeError("connection lost")
        return (group, len(calls))

    reads = _GroupReads(fetch)
    with pytest.raises(RuntimeError, match=r"^connection lost$"):
        reads.read("g")
    assert reads.read("g") == ("g", 2)
    assert not reads._next
    assert not reads._running


_GEVENT_SCRIPT = r"""
from gevent import monkey
monkey.patch_all()
import json, sys, gevent
sys.path.insert(0, sys.argv[1])
import django
django.setup()  # the module's models; nothing here touches a database
from assignments import fastpath
from assignments.fastpath import _GroupReads
from tests.polling import until as _until
from coordinator_project.process_state import PROCESS
PROCESS.start(cooperative=True)  # as gunicorn's post_worker_init does on a gevent worker

fetches = []

def fetch(group):
    fetches.append(len(arrived))  # how many heartbeats had arrived when this read started
    gevent.sleep(0.001)  # the round trip: the worker's other greenlets run meanwhile
    return (group, len(fetches))

arrived = []

def heartbeat(i):
    gevent.sleep(0)  # each request becomes ready a little after the one before it
    arrived.append(i)
    return reads.read("g")

reads = _GroupReads(fetch, cooperative=fastpath._GROUP_READS.cooperative)
jobs = [gevent.spawn(heartbeat, i) for i in range(20)]
gevent.joinall(jobs, timeout=60)  # a deadline: a loaded machine (the suite's other workers) is slow
print(json.dumps({"cooperative": fastpath._GROUP_READS.cooperative, "fetches": fetches,
                  "answers": [j.value if j.successful() else repr(j.exception) if j.ready() else "not done"
                              for j in jobs]}))
"""


def test_under_gevent_ready_heartbeats_join_the_read_before_it_starts():
    """On gevent workers the first heartbeat to need a read lets the worker's ready greenlets
    run before it starts the read, so they share it instead of each waiting for a read of
    its own; a read still starts only after every heartbeat that uses it arrived."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _GEVENT_SCRIPT, str(root)], capture_output=True,
                         text=True, timeout=120, check=True, cwd=root,
                         env={"DJANGO_SETTINGS_MODULE": "coordinator_project.test_settings",
                              "SECRET_KEY": "test", "PATH": "/usr/bin:/bin"})
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["cooperative"] is True
    assert len(result["fetches"]) == 1, result["fetches"]  # all twenty shared one read
    assert result["fetches"][0] == 20  # which started after all of them had arrived
    assert {tuple(a) for a in result["answers"]} == {("g", 1)}


class _Dropped(BaseException):
    """Stands in for wsgi_guard's deadline, raised into a request wherever it waits."""


class _DroppedWhileWaiting:
    """A read in flight whose wait drops the heartbeat that waits for it."""

    def __init__(self) -> None:
        self.done = self

    def is_set(self) -> bool:
        return False

    def wait(self) -> None:
        raise _Dropped


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, dict[str, object]]:
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["row"] = fn()
        except BaseException as exc:  # the test reads what ended it
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_i26_2_a_leader_dropped_before_its_read_starts_leaves_the_group_readable():
    """The leader of the next read waits for the one in flight and is dropped there (its
    deadline): the group's later heartbeats in this process must still get reads. Before, the
    unstarted read stayed the group's next and every later heartbeat waited on it forever."""
    reads = _GroupReads(lambda group: (group, "row"))
    reads._running["g"] = _DroppedWhileWaiting()  # type: ignore[assignment]
    with pytest.raises(_Dropped):
        reads.read("g")
    del reads._running["g"]
    t, out = _in_thread(lambda: reads.read("g"))
    t.join(5)
    assert not t.is_alive(), "a later heartbeat waits forever on the dropped leader's read"
    assert out == {"row": ("g", "row")}


def test_i26_2_heartbeats_sharing_a_read_whose_leader_is_dropped_read_again():
    """B leads the read after A's, C shares it; B is dropped mid-read. C must not get an empty
    row (which reads as "no such group"): it reads again."""
    release = [threading.Event(), threading.Event()]
    calls: list[str] = []

    def fetch(group: str) -> tuple:
        calls.append(group)
        n = len(calls)
        if n <= 2:
            assert release[n - 1].wait(10)
        if n == 2:
            raise _Dropped
        return (group, n)

    reads = _GroupReads(fetch)
    a, from_a = _in_thread(lambda: reads.read("g"))
    _until(lambda: len(calls) == 1, "A's read to start")
    b, from_b = _in_thread(lambda: reads.read("g"))
    _until(lambda: "g" in reads._next, "B to lead the next read")
    c, from_c = _in_thread(lambda: reads.read("g"))
    _until(lambda: reads._next["g"].joined == 2, "C to share B's read")
    release[0].set()
    _until(lambda: len(calls) == 2, "B's read to start")
    release[1].set()
    for t in (a, b, c):
        t.join(5)
    assert from_a == {"row": ("g", 1)}
    assert isinstance(from_b.get("error"), _Dropped)
    assert from_c == {"row": ("g", 3)}
