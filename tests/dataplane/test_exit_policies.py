"""Issue 25.5: exit policies an orchestrator can act on (persistent refusals raise, an
unreachable coordinator is retried, stop(timeout) abandons what is still in flight)."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import pytest

from dataplane import AuthenticationError, Consumer, GroupNotFoundError, Message
from dataplane.routing import ShardKeys
from tests import spawn

from ..consumer_thread import run_consumer
from .conftest import ROOT, version_doc, wait_until


def metadata(prefix: str, session_ms: int) -> dict:
    return {
        "metadataEpoch": 1, "group": "g", "stream": "orders", "heartbeatIntervalMs": 100,
        "sessionTimeoutMs": session_ms, "startPosition": "earliest", "keyPrefix": prefix,
        "versions": [version_doc("orders", 1, 2, prefix)],
    }  # fmt: skip


def run_in_thread(c: Consumer) -> tuple[threading.Thread, list[BaseException], list[float]]:
    running = run_consumer(c, daemon=False)
    return running.thread, running.raised, running.ended


def refuse_after_join(coordinator, answer: tuple[int, dict]) -> dict:
    """Accept the first join, then answer everything (rejoins too) with ``answer`` while
    ``state["refuse"]``."""
    base = coordinator.default_heartbeat
    state: dict = {"refuse": False, "since": None}

    def heartbeat(req: dict):
        if state["refuse"]:
            if state["since"] is None:
                state["since"] = time.monotonic()
            return answer
        return base(req)

    coordinator.heartbeat = heartbeat
    return state


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (401, {"errorCode": "AUTHENTICATION_FAILED", "errorMessage": "x"}, AuthenticationError),
        (403, {"errorCode": "AUTHORIZATION_FAILED", "errorMessage": "x"}, AuthenticationError),
        (404, {"errorCode": "GROUP_ID_NOT_FOUND", "errorMessage": "deleted"}, GroupNotFoundError),
    ],
)
def test_i25_5_persistent_refusal_after_the_session_is_lost_raises(
    prefix, coordinator, redis_url, status, body, error
) -> None:
    coordinator.metadata = metadata(prefix, session_ms=800)
    state = refuse_after_join(coordinator, (status, body))
    lost: list[list[str]] = []
    c = Consumer(coordinator.url, "g", "k", lambda m: None, redis_url=redis_url, block_ms=100,
                 refusal_timeout_s=1.0, on_lost=lost.append)  # fmt: skip
    t, raised, ended = run_in_thread(c)
    try:
        wait_until(lambda: len(c.machine.readable) == 2, what="joined")
        state["refuse"] = True
        t.join(30)
    finally:
        c.stop()
        t.join(15)
    assert not t.is_alive()
    assert len(raised) == 1, raised
    assert isinstance(raised[0], error), raised
    took = ended[0] - state["since"]
    # Not before the session (0.8 s) is lost and the refusal lasted refusal_timeout_s (1 s);
    # bounded by both plus the membership backoff (at most 5 s) and a heartbeat.
    assert 1.0 <= took <= 10.0, took
    assert lost == [["orders:1:0", "orders:1:1"]]  # the session loss aborted them first


def test_i25_5_unreachable_coordinator_keeps_being_retried(
    prefix, coordinator, redis_url
) -> None:
    coordinator.metadata = metadata(prefix, session_ms=500)
    state = refuse_after_join(coordinator, (503, {"errorCode": "X", "errorMessage": "down"}))
    c = Consumer(coordinator.url, "g", "k", lambda m: None, redis_url=redis_url, block_ms=100,
                 refusal_timeout_s=0.2)  # fmt: skip
    t, raised, _ = run_in_thread(c)
    try:
        wait_until(lambda: len(c.machine.readable) == 2, what="joined")
        state["refuse"] = True
        wait_until(lambda: c.machine.readable == {}, what="session lost: shards aborted")
        n = len(coordinator.requests)
        wait_until(lambda: len(coordinator.requests) > n + 3, timeout=30, what="retries")
        assert t.is_alive()
        assert raised == []
        state["refuse"] = False
        wait_until(lambda: len(c.machine.readable) == 2, timeout=30, what="resumed or joined again")
    finally:
        c.stop()
        t.join(15)
    assert raised == []


def test_i25_5_stop_timeout_abandons_in_flight_work_unacked_and_logs_it(
    r, prefix, coordinator, redis_url, caplog
) -> None:
    coordinator.metadata = metadata(prefix, session_ms=30000)
    stream = ShardKeys("orders:1:0", prefix).stream
    r.xadd(stream, {"key": "a", "n": "1"})
    started, release, done = threading.Event(), threading.Event(), threading.Event()

    def handler(m: Message) -> None:
        started.set()
        release.wait(30)
        done.set()

    lost: list[list[str]] = []
    revoked: list[list[str]] = []
    caplog.set_level(logging.WARNING, logger="dataplane")
    c = Consumer(coordinator.url, "g", "k", handler, redis_url=redis_url, block_ms=100,
                 on_lost=lost.append, on_revoked=revoked.append)  # fmt: skip
    t, raised, ended = run_in_thread(c)
    try:
        assert started.wait(15)
        asked = time.monotonic()
        c.stop(timeout=0.3)
        t.join(15)
        assert not t.is_alive()
        assert ended[0] - asked < 8.0  # 0.3 s, then the runtime's bounded stop
        release.set()
        assert done.wait(5)
    finally:
        release.set()
        c.stop()
        t.join(15)
    assert raised == []
    assert r.xpending(stream, "g")["pending"] == 1  # not ACKed: the next owner gets it
    assert lost == [["orders:1:0"]]
    assert revoked == [["orders:1:1"]]  # nothing in flight there: handed over cleanly
    assert coordinator.requests[-1]["memberEpoch"] == -1
    assert any("abandoning in-flight work, not ACKed: orders:1:0 (1 in flight)"
               in rec.getMessage() for rec in caplog.records)  # fmt: skip


def test_i25_5_cli_exits_2_with_one_line_when_the_refusal_persists(
    prefix, coordinator, redis_url, tmp_path
) -> None:
    import os

    coordinator.metadata = metadata(prefix, session_ms=600)
    state = refuse_after_join(coordinator, (401, {"errorCode": "AUTHENTICATION_FAILED",
                                                  "errorMessage": "revoked"}))  # fmt: skip
    (tmp_path / "h.py").write_text("def handle(msg):\n    pass\n")
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = spawn.Popen(
        [sys.executable, "-m", "dataplane", "consume", "--coordinator", coordinator.url,
         "--group", "g", "--api-key", "k", "--redis", redis_url, "--handler", "h:handle",
         "--block-ms", "100", "--refusal-timeout", "0.5"],
        env=e, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: any(q["memberEpoch"] == 1 for q in coordinator.requests),
                   timeout=30, what="joined")  # fmt: skip
        state["refuse"] = True
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the coordinator refused the key of group 'g': HTTP 401"), err
    assert "Traceback" not in err
