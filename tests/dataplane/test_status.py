"""Issue 25.3 (status part): Consumer.status() and the CLI's SIGUSR1 status line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading

import pytest
import redis

from dataplane import Consumer, ConsumerStatus, Message
from dataplane.routing import ShardKeys
from tests import spawn
from tests.member_http import get
from tests.ports import free_port

from .conftest import ROOT, version_doc, wait_until


def metadata(prefix: str) -> dict:
    return {
        "metadataEpoch": 1, "group": "g", "stream": "orders", "heartbeatIntervalMs": 100,
        "sessionTimeoutMs": 30000, "startPosition": "earliest", "keyPrefix": prefix,
        "versions": [version_doc("orders", 1, 2, prefix)],
    }  # fmt: skip


def test_i25_3_status_is_a_typed_snapshot_of_the_member(r, prefix, coordinator, redis_url):
    coordinator.metadata = metadata(prefix)
    release = threading.Event()

    def handler(m: Message) -> None:
        release.wait(10)

    c = Consumer(coordinator.url, "g", "k", handler, redis_url=redis_url,
                 member_id="member-s", block_ms=100)  # fmt: skip
    before = c.status()
    assert isinstance(before, ConsumerStatus)
    assert (before.state, before.member_epoch, before.owned_shards) == ("JOINING", 0, ())
    assert before.last_heartbeat_at is None
    r.xadd(ShardKeys("orders:1:0", prefix).stream, {"key": "a"})
    t = threading.Thread(target=c.run)
    t.start()
    try:
        wait_until(lambda: c.status().in_flight == 1, what="one message in flight")
        st = c.status()
        assert st.member_id == "member-s"
        assert st.group == "g"
        assert st.member_epoch == 1
        assert st.state == "OK"
        assert st.owned_shards == ("orders:1:0", "orders:1:1")
        assert st.revoking_shards == ()
        assert st.last_error is None
        assert st.seconds_since_last_heartbeat is not None
        assert 0 <= st.seconds_since_last_heartbeat < 10
        release.set()
        wait_until(lambda: c.status().in_flight == 0, what="finished")
    finally:
        release.set()
        c.stop()
        t.join(15)
    after = c.status()
    assert after.state == "LEFT"
    assert after.owned_shards == ()
    assert after.as_dict()["member_id"] == "member-s"


def test_i25_3_cli_prints_the_status_as_one_json_line_on_sigusr1(
    prefix, coordinator, redis_url, tmp_path
) -> None:
    coordinator.metadata = metadata(prefix)
    (tmp_path / "h.py").write_text("def handle(msg):\n    pass\n")
    proc = spawn.Popen(
        [sys.executable, "-m", "dataplane", "consume", "--coordinator", coordinator.url,
         "--group", "g", "--api-key", "k", "--redis", redis_url, "--handler", "h:handle",
         "--block-ms", "100", "--member-id", "cli-status"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        reqs = coordinator.requests
        wait_until(lambda: any(q["memberEpoch"] == 1 and q["ownedShards"] for q in reqs),
                   timeout=30, what="joined")  # fmt: skip
        proc.send_signal(signal.SIGUSR1)
        n = len(coordinator.requests)
        wait_until(lambda: len(coordinator.requests) > n + 1, what="still heartbeating")
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    lines = [json.loads(x) for x in err.splitlines() if x.startswith('{"status"')]
    assert len(lines) == 1, err
    st = lines[0]["status"]
    assert st["member_id"] == "cli-status"
    assert st["state"] == "OK"
    assert st["owned_shards"] == ["orders:1:0", "orders:1:1"]


def _status_cli(port: int) -> subprocess.CompletedProcess[str]:
    return spawn.run(
        [sys.executable, "-m", "dataplane", "status", "--metrics-port", str(port)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs a redis-server binary")
def test_i25_3_healthz_and_the_status_command_turn_unhealthy_when_redis_is_unreachable(
    prefix, coordinator, tmp_path
) -> None:
    """A real Redis of the test's own, stopped while the member runs: /healthz answers 503
    "Redis unreachable" and ``rsc-dataplane status`` prints it with exit 1 (0 while healthy;
    3 when no member answers on the port)."""
    coordinator.metadata = metadata(prefix)
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        probe = redis.Redis(port=port)
        wait_until(lambda: _pings(probe), what="the throwaway redis-server")
        probe.close()
        url = f"redis://127.0.0.1:{port}/0"
        c = Consumer(coordinator.url, "g", "k", lambda m: None, member_id="member-h",
                     redis_url=url, block_ms=100, metrics_port=0)  # fmt: skip
        t = threading.Thread(target=c.run)
        t.start()
        try:
            wait_until(lambda: c.metrics_port, what="serving")
            mport = c.metrics_port
            wait_until(lambda: get(mport, "/healthz")[0] == 200, timeout=20, what="healthy")
            out = _status_cli(mport)
            assert out.returncode == 0, out.stderr
            doc = json.loads(out.stdout)
            assert (doc["healthy"], doc["reason"]) == (True, None)
            assert doc["status"]["member_id"] == "member-h"
            assert doc["status"]["owned_shards"] == ["orders:1:0", "orders:1:1"]

            server.terminate()
            server.wait(10)
            wait_until(lambda: get(mport, "/healthz")[0] == 503, timeout=20, what="unhealthy")
            assert get(mport, "/healthz")[1] == "Redis unreachable\n"
            out = _status_cli(mport)
            assert out.returncode == 1, out.stderr
            doc = json.loads(out.stdout)
            assert (doc["healthy"], doc["reason"]) == (False, "Redis unreachable")
            assert out.stderr.strip() == "unhealthy: Redis unreachable"
        finally:
            c.stop(timeout=1)
            t.join(30)
        assert not t.is_alive()
        # Nothing listens any more: exit 3, one line.
        out = _status_cli(mport)
        assert out.returncode == 3, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        expected = f"error: no member answers at http://127.0.0.1:{mport}/status"
        assert out.stderr.startswith(expected), out.stderr
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False
