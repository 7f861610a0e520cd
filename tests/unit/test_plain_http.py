"""tests/plain_http.KeepAlive, the tests' cheap client for count-bound loops: one connection
while the server keeps it, a new one where the server closed it, and no second send of a request
a fresh connection could not deliver."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.plain_http import KeepAlive


class _Echo(BaseHTTPRequestHandler):
    """Answers with the connection's number and what it read. `/close` ends the connection after
    its answer and says so; `/quiet-close` ends it after its answer without saying so (as a
    server's idle timeout does later); `/drop` ends it without an answer."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        server: _Server = self.server  # type: ignore[assignment]
        with server.lock:
            server.connections += 1
            self.number = server.connections

    def _answer(self) -> None:
        if self.path == "/drop":
            self.close_connection = True
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = json.dumps({"connection": self.number, "method": self.command, "host": self.headers["Host"],
                           "type": self.headers.get("Content-Type"),
                           "body": self.rfile.read(length).decode()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        if self.path == "/close":
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = self.path in ("/close", "/quiet-close")

    do_GET = do_POST = do_OPTIONS = _answer

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the tests read the answers, not the server's access log."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    connections = 0
    lock = threading.Lock()


@pytest.fixture
def served() -> Iterator[tuple[str, _Server]]:
    srv = _Server(("127.0.0.1", 0), _Echo)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", srv
    finally:
        srv.shutdown()
        srv.server_close()


def test_keepalive_sends_every_request_on_one_connection_while_the_server_keeps_it(
    served: tuple[str, _Server],
):
    with KeepAlive(served[0]) as c:
        answers = [json.loads(c.request(m, "/x", headers={"Host": f"h{i}.example"})[1])
                   for i, m in enumerate(("GET", "OPTIONS", "POST"))]
        status, body = c.request("POST", "/x", json={"memberId": "m"})
    assert status == 200
    assert {a["connection"] for a in answers} == {1}
    assert [(a["method"], a["host"]) for a in answers] == [("GET", "h0.example"), ("OPTIONS", "h1.example"),
                                                            ("POST", "h2.example")]
    doc = json.loads(body)
    assert (doc["connection"], doc["type"], json.loads(doc["body"])) == (1, "application/json", {"memberId": "m"})


def test_keepalive_opens_a_new_connection_where_the_server_closed_one(served: tuple[str, _Server]):
    url, srv = served
    with KeepAlive(url) as c:
        seen = [json.loads(c.request("GET", path)[1])["connection"] for path in ("/close", "/x", "/quiet-close")]
        # The kept connection is gone when the next request is sent: sent again, on a new one.
        seen.append(json.loads(c.request("GET", "/x")[1])["connection"])
    assert seen == [1, 2, 2, 3]
    # On a connection just opened, a request left unanswered is an error, not sent twice.
    with pytest.raises(ConnectionError), KeepAlive(url) as fresh:
        fresh.request("POST", "/drop", json={})
    assert srv.connections == 4
