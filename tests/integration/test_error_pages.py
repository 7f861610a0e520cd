"""Issue 27.10: every answer outside the admin is the protocol's JSON error body, and the log
lines a client can cause at will are throttled. Against real gunicorn with the shipped config
(gevent worker, DEBUG off).

- Unknown URLs, a function view's 405, a bad Host header: JSON with errorCode (Django's HTML
  before); the admin keeps its HTML pages.
- gunicorn's own refusals (a request line too long, a malformed request line or header): JSON.
- A chunked body is read (not as empty); a body slower than BODY_READ_TIMEOUT_SECONDS: 408.
- 1,000 refused requests of each kind log a bounded number of short lines, no traceback.
"""
from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dataplane.protocol import JOIN_EPOCH
from tests import plain_http

from .conftest import LiveServer, make_group, running_gunicorn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]


@pytest.fixture
def logged_server(tmp_path: Path) -> Iterator[tuple[LiveServer, Path]]:
    log = tmp_path / "gunicorn.log"
    # One join per key, then 429 RATE_LIMITED for the rest of the test (the refusal-lines test).
    with running_gunicorn(log_file=log, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"),
                          BODY_READ_TIMEOUT_SECONDS="2", JOIN_RATE_PER_KEY="0.0001", JOIN_BURST_PER_KEY="1") as server:
        yield server, log


def _port(server: LiveServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _raw(server: LiveServer, data: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send `data` on a fresh connection; the status, headers and body of the answer."""
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=timeout) as s:
        s.sendall(data)
        return _read_answer(s)


def _read_answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        part = s.recv(65536)
        if not part:
            break
        buf += part
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        part = s.recv(65536)
        if not part:
            break
        body += part
    return int(lines[0].split()[1]), headers, body


def _assert_json_error(status: int, headers: dict[str, str], body: bytes, want: int) -> dict[str, object]:
    assert status == want, (status, body[:300])
    assert headers.get("content-type", "").startswith("application/json"), (headers, body[:300])
    doc = json.loads(body)
    assert set(doc) == {"errorCode", "errorMessage"}, doc
    return doc


def test_i27_10_unknown_urls_405_and_a_bad_host_answer_json_not_html(logged_server):
    server, _ = logged_server
    with httpx.Client(verify=plain_http.TLS, base_url=server.url, timeout=10) as c:
        for path in ("/nope", "/api/v1/nope", "/api/v1/groups/g1/heartbeat/extra", "/api/schema/x"):
            r = c.get(path)
            doc = _assert_json_error(r.status_code, dict(r.headers), r.content, 404)
            assert doc["errorCode"] == "INVALID_REQUEST"
        r = c.options("/favicon.ico")  # a function view's 405 (require_safe)
        doc = _assert_json_error(r.status_code, dict(r.headers), r.content, 405)
        assert r.headers["allow"] == "GET, HEAD"
        r = c.post("/favicon.ico")  # a POST outside the API without a CSRF token
        doc = _assert_json_error(r.status_code, dict(r.headers), r.content, 403)
        assert "CSRF" in str(doc["errorMessage"])
        r = c.delete("/api/v1/groups/g1/heartbeat")  # DRF's 405
        _assert_json_error(r.status_code, dict(r.headers), r.content, 405)
        r = c.get("/healthz", headers={"Host": "evil.example"})
        doc = _assert_json_error(r.status_code, dict(r.headers), r.content, 400)
        assert "ALLOWED_HOSTS" in str(doc["errorMessage"])
        r = c.get("/admin/login/")  # the admin keeps Django's HTML pages
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/html")


def test_i27_10_gunicorn_own_refusals_answer_json(logged_server):
    server, _ = logged_server
    too_long = b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n"
    _assert_json_error(*_raw(server, too_long), want=414)
    _assert_json_error(*_raw(server, b"NOT A REQUEST LINE AT ALL\r\n\r\n"), want=400)
    _assert_json_error(*_raw(server, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nBad Header\r\n\r\n"),
                       want=400)


def test_i27_10_a_chunked_body_is_read_under_the_gevent_worker(logged_server):
    server, _ = logged_server
    fx = make_group("chunked", "chunked-g", shards=2)
    body = json.dumps({"memberId": "m-chunked", "memberEpoch": JOIN_EPOCH, "clientId": "c",
                       "rebalanceTimeoutMs": 5000, "ownedShards": []}).encode()

    def chunks() -> Iterator[bytes]:  # a generator: httpx sends Transfer-Encoding: chunked
        yield body[:10]
        yield body[10:]

    with httpx.Client(verify=plain_http.TLS, base_url=server.url, timeout=10) as c:
        r = c.post(fx.url(), content=chunks(),
                   headers={"Authorization": f"Bearer {fx.key}", "Content-Type": "application/json"})
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert r.status_code == 200, r.text
    assert r.json()["memberId"] == "m-chunked"
    assert r.json()["memberEpoch"] > 0


def test_i27_10_a_slow_body_is_408_within_the_body_read_deadline(logged_server):
    server, _ = logged_server  # BODY_READ_TIMEOUT_SECONDS=2
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=15) as s:
        s.sendall(b"POST /api/v1/groups/g1/heartbeat HTTP/1.1\r\nHost: localhost\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
        started = time.monotonic()
        s.setblocking(False)
        answer = b""
        deadline = started + 12
        while time.monotonic() < deadline and not answer:  # one byte every 0.3 s, as an attacker would
            try:
                s.send(b" ")
            except OSError:
                break  # the server closed it: read its answer
            try:
                answer = s.recv(65536, socket.MSG_PEEK)
            except BlockingIOError:
                time.sleep(0.3)  # the attacker's pace, not synchronisation
        elapsed = time.monotonic() - started
        s.settimeout(5)  # blocking again, but bounded: no answer at all fails the test
        status, headers, body = _read_answer(s)
    doc = _assert_json_error(status, headers, body, 408)
    assert doc["errorCode"] == "INVALID_REQUEST"
    assert elapsed < 2 + 2.0, f"408 after {elapsed:.1f} s, BODY_READ_TIMEOUT_SECONDS is 2"


REFUSALS = 1000


def test_i27_10_a_thousand_refused_requests_of_each_kind_log_a_bounded_number_of_lines(logged_server):
    server, log = logged_server
    fx = make_group("refusals", "refusals-g", shards=2)
    started = time.monotonic()
    joined = 0
    # 7,000 requests: the standard library's client costs the test a third of httpx's CPU.
    with plain_http.KeepAlive(server.url) as c:
        for i in range(REFUSALS):
            assert c.request("GET", f"/nope-{i}")[0] == 404
            assert c.request("GET", "/healthz", headers={"Host": f"evil-{i}.example"})[0] == 400
            assert c.request("OPTIONS", "/favicon.ico")[0] == 405
            assert c.request("POST", "/healthz")[0] == 403  # CSRF
            assert c.request("GET", f"/api/v1/groups/{fx.group}", headers={"Authorization": "Bearer nope"})[0] in (401, 429)
            assert c.request("GET", f"/api/v1/groups/bad%20name-{i}", headers={"Authorization": f"Bearer {fx.key}"})[0] == 400
            status, body = c.request("POST", fx.url(), json={"memberId": f"j{i}", "memberEpoch": 0},
                                     headers={"Authorization": f"Bearer {fx.key}"})
            assert status in (200, 429), body
            joined += status == 200
    elapsed = time.monotonic() - started
    assert joined <= 2  # one join per worker's bucket, then RATE_LIMITED
    # Each line is written (unbuffered) before its answer is sent: nothing to wait for.
    lines = log.read_text(errors="replace").splitlines()
    assert not [line for line in lines if "Traceback" in line], "a refusal logged a traceback"
    # One line per kind per 10 s per worker (2 workers), and each throttled line names the count.
    kinds = 7
    bound = 2 * kinds * (int(elapsed // 10) + 2)
    assert len(lines) <= bound, f"{len(lines)} lines for {kinds * REFUSALS} refusals in {elapsed:.0f} s:\n" + \
        "\n".join(lines[:40])
    assert any("DisallowedHost" in line for line in lines), lines
    assert all(len(line) < 600 for line in lines), "a refusal line is not short"
