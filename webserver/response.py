"""gunicorn's HTTP/1 response, its head written together with its body (decision 0025)."""
from __future__ import annotations

from typing import Any

from gunicorn.http import wsgi  # type: ignore[import-untyped]


class Captured:
    """Stands in for a client socket: keeps what gunicorn writes to it."""

    def __init__(self) -> None:
        self.data = b""

    def gettimeout(self) -> float | None:
        return None

    def setblocking(self, flag: bool) -> None:
        pass

    def sendall(self, data: bytes) -> None:
        self.data += data

    def send(self, data: bytes) -> int:
        self.data += data
        return len(data)


# A larger body is written on its own rather than copied behind the head.
ONE_WRITE_MOST = 64 * 1024


class OneWriteResponse(wsgi.Response):
    """gunicorn's response, except that the head goes out in the same write as the body's first
    bytes. gunicorn writes the head, then the body: two sends, two TCP segments, the client
    woken twice. In a steady heartbeat run the head's own send was ~12 % of a worker's samples
    (py-spy); one write took the worker's CPU per request down ~7 % (decision 0025).

    Only where `write` sends the head: `close` and `sendfile` send it as gunicorn does."""

    sock: Any  # the client's socket, or a Captured while the head is made
    _holding = False  # inside write(): a head that send_headers makes is held for the body
    _head: bytes | None = None

    def send_headers(self) -> None:
        if self.headers_sent or not self._holding:
            super().send_headers()
            return
        sock, self.sock = self.sock, Captured()
        try:
            super().send_headers()
        finally:
            captured, self.sock = self.sock, sock
        self._head = captured.data

    def write(self, arg: bytes) -> None:
        self._holding = True
        try:
            super().write(arg)
        finally:
            self._holding = False
            self._flush_head()  # no body bytes went with it: a HEAD, a 304, nothing to send

    def _emit_body(self, data: bytes) -> None:
        head = self._head
        if head is not None and not self.chunked and len(data) <= ONE_WRITE_MOST:
            self._head = None
            self.sock.sendall(head + data)
            return
        self._flush_head()
        super()._emit_body(data)

    def _flush_head(self) -> None:
        head, self._head = self._head, None
        if head is not None:
            self.sock.sendall(head)
