"""Issue 23.6: one wait primitive, and nobody waits while holding a pooled connection.

`coordinator_project.waiting` hands the request's connections back before it blocks (and
only then); a source check fails on any other wait in the coordinator's request code (it
listed the group gate, the member count, both waits of the shared group read and the key
lookup's wait on the tree before the primitive).
"""
from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest

from coordinator_project import dbpool, waiting

ROOT = Path(__file__).resolve().parents[2]
APPS = ("assignments", "groups", "members", "coordinator_project")
# Calls that are not a request waiting for another request. (file, the called object's source)
EXEMPT = {
    ("assignments/fastpath.py", "self._stop"),  # background: the stamp batcher's period
    ("members/intake.py", "stop"),  # background: the intake beacon's period
    ("groups/ratelimit.py", "_auth_failures"),  # TokenBuckets.wait: computes seconds, never blocks
    # The pool's own queue for a connection (the thing the primitive hands connections back to).
    ("coordinator_project/postgresql/base.py", "pos"),
}


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []


@pytest.fixture
def handed_back(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    rec = _Recorder()
    monkeypatch.setattr(dbpool, "hand_back_before_waiting", lambda: rec.calls.append("hand back"))
    return rec


class _BusyLock:
    """Taken on the first try; records whether connections went back before it blocked."""

    def __init__(self, rec: _Recorder) -> None:
        self.rec = rec

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self.rec.calls.append("block" if blocking else "try")
        return blocking

    def release(self) -> None:
        self.rec.calls.append("release")


def test_i23_6_a_waiter_hands_its_connections_back_before_it_blocks(handed_back: _Recorder):
    assert waiting.acquire(_BusyLock(handed_back))
    assert handed_back.calls == ["try", "hand back", "block"]
    handed_back.calls.clear()
    assert not waiting.acquire(_BusyLock(handed_back), blocking=False)
    assert handed_back.calls == ["try"]  # did not wait: kept them
    handed_back.calls.clear()
    with waiting.held(_BusyLock(handed_back)):
        handed_back.calls.append("inside")
    assert handed_back.calls == ["try", "hand back", "block", "inside", "release"]


def test_i23_6_no_wait_costs_nothing_when_nobody_holds_the_lock_or_the_event_is_set(handed_back: _Recorder):
    lock = threading.Lock()
    with waiting.held(lock):
        assert lock.locked()
    done = threading.Event()
    done.set()
    waiting.wait(done)
    assert handed_back.calls == []


def test_i23_6_an_event_waiter_hands_back_before_it_blocks(handed_back: _Recorder):
    done = threading.Event()
    t = threading.Timer(0.05, done.set)
    t.start()
    waiting.wait(done)
    t.join()
    assert handed_back.calls == ["hand back"]


def _waits(path: Path, root: Path = ROOT) -> list[str]:
    """Calls of .wait()/.acquire() and `with` over a subscript (a NamedLocks entry) in one file,
    other than the primitive's own (`waiting.wait`, `waiting.acquire`)."""
    rel = path.relative_to(root).as_posix()
    found = []
    for node in ast.walk(ast.parse(path.read_text(), rel)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("wait", "acquire")):
            target = ast.unparse(node.func.value)
            if target != "waiting" and (rel, target) not in EXEMPT:
                found.append(f"{rel}:{node.lineno} {target}.{node.func.attr}()")
        if isinstance(node, ast.With):
            found += [f"{rel}:{node.lineno} with {ast.unparse(item.context_expr)}"
                      for item in node.items if isinstance(item.context_expr, ast.Subscript)]
    return found


def test_i23_6_every_wait_of_a_request_goes_through_the_primitive():
    found = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts or path.name == "waiting.py":
                continue
            found += _waits(path)
    assert found == [], "wait through coordinator_project.waiting (acquire/held/wait)"


def test_i23_6_the_source_check_finds_a_bare_wait(tmp_path: Path):
    bad = tmp_path / "mod.py"
    bad.write_text("def f(gates, done, name):\n    with gates[name]:\n        done.wait()\n"
                   "    waiting.wait(done)\n")
    assert _waits(bad, tmp_path) == ["mod.py:2 with gates[name]", "mod.py:3 done.wait()"]
