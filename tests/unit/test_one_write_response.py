"""Decision 0025: gunicorn's response with its head written in the same send as its body.

The bytes on the wire are gunicorn's own (the stock response's, compared with their Date line
taken out), in one write where the body fits; every other shape of response is written as
gunicorn writes it."""
from __future__ import annotations

import re
import socket

import pytest
from gunicorn.config import Config  # type: ignore[import-untyped]
from gunicorn.http import wsgi  # type: ignore[import-untyped]
from gunicorn.http.parser import RequestParser  # type: ignore[import-untyped]
from gunicorn.workers.ggevent import GeventWorker  # type: ignore[import-untyped]

from webserver.response import ONE_WRITE_MOST, OneWriteResponse
from webserver.worker import GuardedGeventWorker


class Recording:
    """A client socket that keeps each write apart."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(bytes(data))


def _request(method: str = "POST") -> object:
    ours, theirs = socket.socketpair()
    with ours, theirs:  # no body: nothing is read after the head is parsed
        theirs.sendall(f"{method} /api/v1/groups/g/heartbeat HTTP/1.1\r\nHost: h\r\n\r\n".encode())
        return next(iter(RequestParser(Config(), ours, ("127.0.0.1", 1))))


def _respond(cls: type, method: str, headers: list[tuple[str, str]], chunks: list[bytes]) -> list[bytes]:
    out = Recording()
    response = cls(_request(method), out, Config())
    response.start_response("200 OK", headers)
    for chunk in chunks:
        response.write(chunk)
    response.close()
    return out.writes


def _undated(data: bytes) -> bytes:
    return re.sub(rb"Date: [^\r]*\r\n", b"", data)


def test_a_body_with_its_length_goes_out_in_one_write_with_its_head():
    body = b'{"memberEpoch": 3}'
    writes = _respond(OneWriteResponse, "POST", [("Content-Type", "application/json"),
                                                  ("Content-Length", str(len(body)))], [body])
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert writes[0].endswith(b"\r\n\r\n" + body)
    stock = _respond(wsgi.Response, "POST", [("Content-Type", "application/json"),
                                             ("Content-Length", str(len(body)))], [body])
    assert len(stock) == 2  # what this saves: gunicorn's own writes the head alone
    assert _undated(writes[0]) == _undated(b"".join(stock))


@pytest.mark.parametrize(("method", "headers", "chunks"), [
    ("HEAD", [("Content-Length", "5")], [b"hello"]),  # the body is dropped: the head alone
    ("POST", [("Content-Length", "0")], [b""]),
    ("POST", [("Content-Length", "0")], []),  # close() sends the head
    ("POST", [], [b"first", b"second"]),  # chunked: gunicorn's framing, head written first
    ("POST", [("Content-Length", str(ONE_WRITE_MOST + 1))], [b"x" * (ONE_WRITE_MOST + 1)]),
    ("POST", [("Content-Length", "10")], [b"hello", b"world"]),  # later chunks on their own
], ids=["head-request", "empty-body", "no-write", "chunked", "large-body", "two-chunks"])
def test_every_other_response_carries_gunicorns_own_bytes(method, headers, chunks):
    ours = _respond(OneWriteResponse, method, headers, chunks)
    stock = _respond(wsgi.Response, method, headers, chunks)
    assert _undated(b"".join(ours)) == _undated(b"".join(stock))
    assert len(ours) <= len(stock)


def test_the_guarded_worker_has_gunicorn_make_the_one_write_response(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(wsgi, "Response", wsgi.Response)  # put back after the test
    monkeypatch.setattr(GeventWorker, "init_process", lambda self: None)  # no loop, no app
    GuardedGeventWorker.init_process(object.__new__(GuardedGeventWorker))
    response, _ = wsgi.create(_request(), Recording(), ("127.0.0.1", 1), ("127.0.0.1", 8000), Config())
    assert type(response) is OneWriteResponse
