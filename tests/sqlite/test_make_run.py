"""`make run`'s supervisor (scripts/run.py, issue 12.1), driven as a newcomer runs it: on the
embedded SQLite database in a temp dir, the test's Redis, a free port.

Every process it starts is tracked by pid (and start time, against pid reuse) from /proc, so
"every child is gone" means exactly the processes of that run.
"""
from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import free_port
from tests.sqlite.cleanup import delete_namespace_keys

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
LIVE = ("STABLE", "PENDING", "REVOKING")

pytestmark = pytest.mark.slow


# --- processes ---------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time) of a process, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), fields[0], int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every live descendant of `root`: pid -> start time."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            children.setdefault(st[0], []).append(int(entry))
            starts[int(entry)] = st[2]
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = starts[child]
            todo.append(child)
    return found


def still_running(pids: dict[int, int]) -> list[int]:
    """Those of `pids` still running (a zombie has exited; a reused pid is someone else)."""
    out = []
    for pid, start in pids.items():
        st = _stat(pid)
        if st is not None and st[1] != "Z" and st[2] == start:
            out.append(pid)
    return out


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, on_fail: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {timeout:.0f} s\n{on_fail()}")
        time.sleep(0.2)


# --- the run -------------------------------------------------------------------------------------
class Run:
    """scripts/run.py in a subprocess; stdout is a pipe this test reads and may close."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.tmp, self.port = tmp, port
        self.db = tmp / "coordinator.sqlite3"
        self.stderr_path = tmp / "stderr.log"
        env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_NAMESPACE"}}
        env.update(SQLITE_PATH=str(self.db), REDIS_URL=REDIS_URL, PORT=str(port), LOG_LEVEL="INFO",
                   SWEEP_INTERVAL_SECONDS="1")
        self.stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "scripts/run.py", "--var-dir", str(tmp / "var")], cwd=ROOT, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.stderr,
        )
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.output = b""

    def read(self, seconds: float = 0.2) -> None:
        """What the run wrote within `seconds`; with its stdout closed by the test, waits on the
        process as long instead (returning at once, a loop that read until the exit spun a core
        while the run it measures was stopping)."""
        if self.proc.stdout is None or self.proc.stdout.closed:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(seconds)
            return
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if sel.select(seconds):
                self.output += os.read(self.proc.stdout.fileno(), 1 << 16)

    def text(self) -> str:
        return (self.output.decode(errors="replace")[-6000:] + "\n--- stderr ---\n"
                + self.stderr_path.read_text(errors="replace")[-3000:])

    def wait_output(self, needle: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.output:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no {needle!r} (exit {self.proc.poll()})\n{self.text()}")
            self.read()

    def members(self) -> dict[str, str]:
        try:
            with sqlite3.connect(self.db, timeout=5) as conn:
                return dict(conn.execute("SELECT member_id, status FROM members_member"))
        except sqlite3.OperationalError:  # not migrated yet, or busy
            return {}

    def members_live(self) -> bool:
        self.read()
        states = self.members()
        return all(states.get(m) in LIVE for m in ("demo-1", "demo-2"))

    def wait_exit(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"the supervisor did not exit within {timeout:.0f} s\n{self.text()}")
            self.read()
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.stderr.close()
        delete_namespace_keys(self.db, REDIS_URL)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    runs: list[Run] = []

    def start(port: int | None = None) -> Run:
        runs.append(Run(tmp_path, port or free_port()))
        return runs[-1]

    yield start
    for r in runs:
        r.close()


def running_system(run: Callable[..., Run]) -> tuple[Run, dict[int, int]]:
    """A run whose demo members both joined; and every process it started, by pid."""
    r = run()
    r.wait_output(b"Redis Stream Coordinator is running", 180)
    wait_until(r.members_live, 60, "both demo members live", r.text)
    procs = descendants(r.proc.pid)
    names = {Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
             for p in procs}
    assert any("gunicorn" in n for n in names), names
    assert any(" worker" in n for n in names), names
    return r, procs


# --- tests ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sig", "close_stdout"),
    [
        (signal.SIGINT, True),  # `make run | tee log`, Ctrl-C: tee is gone first, then the SIGINT
        (signal.SIGHUP, False),  # the terminal closed
        (None, True),  # only the reader died: the next line written hits EPIPE
    ],
    ids=["sigint-closed-stdout", "sighup", "closed-stdout"],
)
def test_run_stop_ends_every_child_and_members_leave_first(
    run: Callable[..., Run], sig: signal.Signals | None, close_stdout: bool
):
    r, procs = running_system(run)
    assert r.proc.stdout is not None
    if close_stdout:
        r.proc.stdout.close()
    if sig is not None:
        os.kill(r.proc.pid, sig)
    assert r.wait_exit(90) == 0, r.text()
    wait_until(lambda: not still_running(procs), 10, "every child gone",
               lambda: f"still running: {still_running(procs)}\n{r.text()}")
    # LEFT is written by the coordinator answering the -1: it was still up when they left.
    assert {m: r.members()[m] for m in ("demo-1", "demo-2")} == {"demo-1": "LEFT", "demo-2": "LEFT"}


def test_run_a_part_that_dies_stops_the_rest_with_a_nonzero_exit(run: Callable[..., Run]):
    r, procs = running_system(run)
    worker = next(p for p in procs
                  if b"worker" in Path(f"/proc/{p}/cmdline").read_bytes() and descendants(p))  # prefork parent
    os.kill(worker, signal.SIGKILL)
    assert r.wait_exit(90) == 1, r.text()
    assert "worker exited" in r.stderr_path.read_text(), r.text()
    wait_until(lambda: not still_running(procs), 10, "every child gone",
               lambda: f"still running: {still_running(procs)}\n{r.text()}")
    assert {m: r.members()[m] for m in ("demo-1", "demo-2")} == {"demo-1": "LEFT", "demo-2": "LEFT"}


def test_run_children_die_with_a_killed_supervisor(run: Callable[..., Run]):
    """SIGKILL leaves no time to stop anything: PR_SET_PDEATHSIG must end the parts."""
    r, procs = running_system(run)
    os.kill(r.proc.pid, signal.SIGKILL)
    r.proc.wait()
    wait_until(lambda: not still_running(procs), 45, "every child gone after the supervisor's death",
               lambda: f"still running: {still_running(procs)}\n{r.text()}")


def test_run_on_a_busy_port_fails_fast_before_starting_anything(run: Callable[..., Run]):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        r = run(port)
        code = r.wait_exit(30)
    assert code == 2, r.text()
    assert time.monotonic() - started < 30
    err = r.stderr_path.read_text()
    assert f"port {port} on 127.0.0.1 is already in use" in err, r.text()
    assert len(err.strip().splitlines()) == 1, err  # one clear line, no traceback
    assert not r.db.exists()  # nothing started: not even the migrations ran
