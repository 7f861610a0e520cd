"""Issue 8.2: slow clients do not stall the shipped server.

100 connections send a request header a byte every 2 s (reconnecting when the server drops
them) for 20 s, against gunicorn with the shipped config. Meanwhile a member's steady
heartbeats keep a p99 under 100 ms. With the old setup (WORKER_CLASS=sync: 2 sync workers)
the slow connections hold both workers and heartbeats time out, so this test fails there.

On a loaded machine (the suite's other workers) the bound is this machine's own noise: the
p99 of heartbeats alone, before and after, times NOISE_FACTOR, when that is above 100 ms; and
the heartbeats go on until MIN_HEARTBEATS were sent (within DEADLINE_S), not for a fixed time
that a slow machine fills with fewer.
"""
from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from tests import plain_http

from .conftest import LiveServer, make_group

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]

SLOW_CONNECTIONS = 100
HOLD_SECONDS = 20.0
BYTE_EVERY = 2.0
P99_LIMIT_MS = 100.0
TIMEOUT_S = 2.0  # a heartbeat not answered by then counts as this slow
MIN_HEARTBEATS = 201
DEADLINE_S = 120.0
NOISE_FACTOR = 3.0


class SlowClients:
    """Keeps `n` connections open, each trickling a request header one byte at a time."""

    HEADER = b"POST /api/v1/groups/slow-g/heartbeat HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4096

    def __init__(self, host: str, port: int, n: int) -> None:
        self.addr, self.n = (host, port), n
        self.stop = threading.Event()
        self.reconnects = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SlowClients:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def _connect(self) -> tuple[socket.socket, int]:
        s = socket.create_connection(self.addr, timeout=5)
        s.setblocking(False)
        return s, 0

    def _run(self) -> None:
        conns = [self._connect() for _ in range(self.n)]
        while not self.stop.wait(BYTE_EVERY):
            for i, (s, sent) in enumerate(conns):
                try:
                    s.send(self.HEADER[sent:sent + 1])
                    conns[i] = (s, sent + 1)
                except OSError:  # the server dropped a too-slow request: come back
                    s.close()
                    self.reconnects += 1
                    conns[i] = self._connect()
        for s, _ in conns:
            s.close()


def _join_and_settle(client: httpx.Client, url: str, key: str) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {key}"}
    r = client.post(url, json={"memberId": "m1", "memberEpoch": 0}, headers=headers).json()
    body = {"memberId": "m1", "memberEpoch": r["memberEpoch"],
            "metadataEpoch": r["metadata"]["metadataEpoch"], "ownedShards": r["assignment"]["assignedShards"]}
    r = client.post(url, json=body, headers=headers).json()
    assert r["status"] == "OK", r
    assert r["errorCode"] == "NONE", r
    return body


def _heartbeats(client: httpx.Client, url: str, body: dict[str, object], headers: dict[str, str],
                seconds: float, at_least: int = 0) -> list[float]:
    """Steady heartbeats for `seconds` and until `at_least` were sent (DEADLINE_S at most);
    each one's latency in ms (a failure counts as TIMEOUT_S)."""
    latencies: list[float] = []
    started = time.monotonic()
    end, deadline = started + seconds, started + DEADLINE_S
    while (time.monotonic() < end or len(latencies) < at_least) and time.monotonic() < deadline:
        started = time.perf_counter()
        try:
            r = client.post(url, json=body, headers=headers)
            ok = r.status_code == 200 and r.json()["status"] == "OK"
            latencies.append((time.perf_counter() - started) * 1000 if ok else TIMEOUT_S * 1000)
        except httpx.HTTPError:
            latencies.append(TIMEOUT_S * 1000)
        time.sleep(0.02)  # a member's heartbeat interval, compressed
    return sorted(latencies)


def _p(latencies: list[float], q: float) -> float:
    return latencies[max(0, int(len(latencies) * q) - 1)]


def test_slow_clients_do_not_push_other_clients_heartbeat_p99_over_100ms(gunicorn_server: LiveServer):
    fx = make_group(stream="slow", group="slow-g", shards=4)
    host, port = gunicorn_server.url.removeprefix("http://").split(":")
    url = f"{gunicorn_server.url}{fx.url()}"
    headers = {"Authorization": f"Bearer {fx.key}"}
    with httpx.Client(verify=plain_http.TLS, timeout=TIMEOUT_S) as client:
        body = _join_and_settle(client, url, fx.key)
        alone = _heartbeats(client, url, body, headers, 5)  # for the report: this machine's noise
        with SlowClients(host, int(port), SLOW_CONNECTIONS) as slow:
            latencies = _heartbeats(client, url, body, headers, HOLD_SECONDS, MIN_HEARTBEATS)
            reconnects = slow.reconnects
        alone = sorted(alone + _heartbeats(client, url, body, headers, 5))
    p50, p99 = _p(latencies, 0.5), _p(latencies, 0.99)
    print(f"without slow clients: p50 {_p(alone, 0.5):.1f} ms p99 {_p(alone, 0.99):.1f} ms; with "
          f"{SLOW_CONNECTIONS}: {len(latencies)} heartbeats p50 {p50:.1f} ms p99 {p99:.1f} ms; "
          f"slow reconnects {reconnects}")
    assert len(latencies) >= MIN_HEARTBEATS, f"{len(latencies)} heartbeats in {DEADLINE_S} s"
    limit = max(P99_LIMIT_MS, NOISE_FACTOR * _p(alone, 0.99))
    assert p99 <= limit, f"p99 {p99:.1f} ms (p50 {p50:.1f} ms) over {len(latencies)} heartbeats (limit {limit:.0f} ms)"
    # The read timeout is set: too-slow requests were dropped (and came back) during the run.
    assert reconnects >= SLOW_CONNECTIONS
