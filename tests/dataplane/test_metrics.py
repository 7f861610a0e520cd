"""Issue 25.3: member-side Prometheus metrics, /healthz, and nothing imported when off."""

from __future__ import annotations

import sys
import threading

from dataplane import Consumer, Message
from dataplane.routing import ShardKeys
from tests import spawn
from tests.member_http import get, samples

from .conftest import ROOT, version_doc, wait_until


def metadata(prefix: str, session_ms: int = 30000) -> dict:
    return {
        "metadataEpoch": 1, "group": "g", "stream": "orders", "heartbeatIntervalMs": 100,
        "sessionTimeoutMs": session_ms, "startPosition": "earliest", "keyPrefix": prefix,
        "versions": [version_doc("orders", 1, 2, prefix)],
    }  # fmt: skip


def value(port: int, name: str, **labels: str) -> float:
    return samples(port).get((name, tuple(sorted(labels.items()))), 0.0)


def run_consumer(c: Consumer) -> threading.Thread:
    t = threading.Thread(target=c.run)
    t.start()
    wait_until(lambda: c.metrics_port, what="serving")
    return t


def test_i25_3_metrics_count_messages_retries_dead_letters_and_refused_reads(
    r, prefix, coordinator, redis_url
) -> None:
    coordinator.metadata = metadata(prefix)
    s0, s1 = (ShardKeys(f"orders:1:{i}", prefix) for i in range(2))
    for i in range(5):
        r.xadd(s0.stream, {"key": f"k{i}"})
    r.xadd(s1.stream, {"key": "flaky"})
    r.xadd(s1.stream, {"key": "poison"})
    flaky: list[int] = []

    def handler(m: Message) -> None:
        if m.key == "poison":
            raise ValueError("poison")
        if m.key == "flaky" and not flaky:
            flaky.append(1)
            raise ValueError("once")

    c = Consumer(coordinator.url, "g", "k", handler, redis_url=redis_url, block_ms=100,
                 max_deliveries=2, retry_backoff_ms=1, metrics_port=0)  # fmt: skip
    assert c.health() == "not joined yet"
    t = run_consumer(c)
    try:
        port = c.metrics_port
        wait_until(lambda: r.xlen(s1.dlq("g")) == 1, what="poison dead-lettered")
        wait_until(lambda: value(port, "rsc_member_messages_handled_total", shard="orders:1:0")
                   == 5, what="handled counted")  # fmt: skip
        got = samples(port)

        def v(name: str, **labels: str) -> float:
            return got.get((name, tuple(sorted(labels.items()))), 0.0)

        assert v("rsc_member_messages_handled_total", shard="orders:1:1") == 1  # flaky, 2nd run
        assert v("rsc_member_messages_failed_total", shard="orders:1:1") == 3  # flaky 1, poison 2
        assert v("rsc_member_messages_retried_total", shard="orders:1:1") == 2
        assert v("rsc_member_messages_dead_lettered_total", shard="orders:1:1") == 1
        assert v("rsc_member_handler_seconds_count") == 9
        assert v("rsc_member_owned_shards") == 2
        assert v("rsc_member_in_flight") == 0
        assert v("rsc_member_heartbeat_rtt_seconds_count") >= 1
        assert 0 <= v("rsc_member_seconds_since_last_heartbeat") < 5
        assert v("rsc_member_healthy") == 1
        assert get(port, "/healthz") == (200, "ok\n")
        # A read Redis refuses (the fence token moved on) is counted.
        r.set(s0.fence("g"), "999:someone-else")
        wait_until(lambda: value(port, "rsc_member_fenced_reads_refused_total",
                                 shard="orders:1:0") >= 1, what="refused read")  # fmt: skip
    finally:
        c.stop()
        t.join(15)
    assert not t.is_alive()


def test_i25_3_healthz_turns_503_when_the_session_is_lost_and_counts_heartbeat_errors(
    prefix, coordinator, redis_url
) -> None:
    coordinator.metadata = metadata(prefix, session_ms=1000)
    base = coordinator.default_heartbeat
    state = {"refuse": False}

    def heartbeat(req: dict):
        if state["refuse"] and req["memberEpoch"] >= 0:
            return 400, {"errorCode": "INVALID_REQUEST", "errorMessage": "no"}
        return base(req)

    coordinator.heartbeat = heartbeat
    c = Consumer(coordinator.url, "g", "k", lambda m: None, redis_url=redis_url, block_ms=100,
                 metrics_port=0)  # fmt: skip
    t = run_consumer(c)
    try:
        port = c.metrics_port
        wait_until(lambda: get(port, "/healthz")[0] == 200, what="healthy once joined")
        state["refuse"] = True
        wait_until(lambda: get(port, "/healthz")[0] == 503, what="unhealthy")
        _status, body = get(port, "/healthz")
        assert body.startswith("session lost"), body
        assert value(port, "rsc_member_heartbeat_errors_total", error_code="INVALID_REQUEST") >= 1
        assert value(port, "rsc_member_healthy") == 0
        state["refuse"] = False
        wait_until(lambda: get(port, "/healthz")[0] == 200, what="healthy again")
    finally:
        state["refuse"] = False
        c.stop()
        t.join(15)
    assert not t.is_alive()
    assert c.health() == "left the group"


def test_i25_3_i25_6_with_metrics_and_tracing_off_nothing_of_them_is_imported(
    prefix, coordinator, redis_url
) -> None:
    """A consumer and a producer run in a fresh interpreter where importing prometheus_client
    or opentelemetry fails as if the extras were not installed: they work, and no dataplane
    module tried to import either. (redis-py itself tries opentelemetry when it is installed,
    guarded by its own ``except ImportError``: that attempt is not the library's.)"""
    coordinator.metadata = metadata(prefix)
    from .conftest import routing_doc

    coordinator.routing = routing_doc("orders", prefix, *metadata(prefix)["versions"], write=1)
    code = f"""
import sys, threading, time, traceback
tried = []
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("prometheus_client", "opentelemetry"):
            frames = [f.filename for f in traceback.extract_stack()[:-1]]
            importer = [f for f in frames if not f.startswith("<")][-1]  # the import statement's
            tried.append((name, importer if "/dataplane/" in importer else None))
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, NotInstalled())
from dataplane import Consumer, Producer
got = []
c = Consumer({coordinator.url!r}, "g", "k", got.append, redis_url={redis_url!r}, block_ms=100)
t = threading.Thread(target=c.run); t.start()
with Producer({coordinator.url!r}, "orders", "k", redis_url={redis_url!r}) as p:
    p.send("a", {{"n": "1"}})
deadline = time.monotonic() + 20
while not got and time.monotonic() < deadline:
    time.sleep(0.01)
c.stop(); t.join(15)
assert got, "nothing consumed"
print("BY DATAPLANE", [(n, importer) for n, importer in tried if importer])
print("PROMETHEUS", [n for n, _ in tried if n.startswith("prometheus_client")])
"""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    out = spawn.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "BY DATAPLANE []" in out.stdout, out.stdout
    assert "PROMETHEUS []" in out.stdout, out.stdout
