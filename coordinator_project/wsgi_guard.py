"""Deadlines around every request, in front of Django (issues 27.1, 27.4 and 27.10).

- The body is read here, in full and against BODY_READ_TIMEOUT_SECONDS, before Django sees the
  request. gunicorn's gevent worker times only the request line and headers, so a client that
  announced `Content-Length: 100000` and sent a byte every 3 s held its slot for days; now it
  gets 408 and the connection is closed. A chunked body (no Content-Length) is read the same
  way and handed to Django with its length: Django read it as empty before.
- The application then runs under a deadline (REQUEST_DEADLINE_SECONDS for the API,
  READYZ_DEADLINE_SECONDS for /readyz, OTHER_REQUEST_DEADLINE_SECONDS for the rest). Past it the
  request is dropped where it waits (a database that stopped answering, a lock, the pool) and
  answers 503 COORDINATOR_UNAVAILABLE; its transaction is never committed, and its database
  connections are closed without a word to the server (which may be frozen). Without it, a
  frozen database connection hung the request, and after the thaw the node applied requests
  whose clients had long given up.

Both deadlines need gevent's cooperative I/O (the shipped worker class): under a sync worker
the body is still read in full (chunked bodies work) but nothing is timed.
"""
from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import gevent
from django.conf import settings
from django.db import connections
from gevent import monkey

from coordinator_project import waiting
from coordinator_project.logging import LogThrottle
from coordinator_project.process_state import PROCESS
from dataplane.protocol import ErrorCode
from webserver.phases import Phase, mark

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

# One warning line per kind per 10 s (with a count), not one per request of an attack.
_refusals = PROCESS.own(
    "connection refusal log throttle", LogThrottle(every=10.0),
    "One warning line per refusal kind per 10 s."
    " key: a refusal's kind -> when its last line was logged, lines held since; bound: 1,000 kinds, then emptied; invalidated: every 10 s per kind; N hosts: per process by design (each logs its own lines).",
)


class OperatorGate:
    """At most OPERATOR_CONCURRENCY operator requests (the admin, the API docs: every path but
    the API, the probes and /metrics) run at once in this worker; up to OPERATOR_QUEUE_MAX more
    wait for a turn (without CPU), the rest answer 503 at once (issue 27.2).

    Greenlets share the worker's one loop in turn, so every request that runs delays every
    other by its CPU bursts: 60 clients fetching the admin login form as fast as it came took
    a heartbeat's p50 to 4 s. With the gate a heartbeat waits behind at most this many admin
    requests' bursts, however many arrive."""

    def __init__(self) -> None:
        self._semaphore: Any = None
        self.waiting = 0

    def semaphore(self) -> Any:
        if self._semaphore is None:
            from gevent.lock import BoundedSemaphore

            self._semaphore = BoundedSemaphore(max(1, settings.OPERATOR_CONCURRENCY))
        return self._semaphore

    def reset(self) -> None:
        self._semaphore, self.waiting = None, 0


_operator_gate = PROCESS.own(
    "operator request gate", OperatorGate(),
    "Admin and docs requests running in this worker (OPERATOR_CONCURRENCY) and waiting for a turn."
    " key: none (one semaphore and a count); bound: OPERATOR_CONCURRENCY running, OPERATOR_QUEUE_MAX"
    " waiting, the rest refused; invalidated: each request releases its turn; N hosts: per worker by"
    " design (it shares out this worker's loop).",
)

_UNGATED_PREFIXES = ("/api/v1/",)
_UNGATED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def is_operator_request(path: str) -> bool:
    return not path.startswith(_UNGATED_PREFIXES) and path not in _UNGATED_PATHS


class RequestDeadlineExceeded(BaseException):
    """Raised into a request's greenlet when its deadline passes. A BaseException, as
    gevent.Timeout is: no `except Exception` on the way (DRF's, a probe's) may turn it into a
    500 or an answer."""


class BodyReadTimeout(Exception):
    """The client did not send its body within BODY_READ_TIMEOUT_SECONDS."""


class BodyCutShort(Exception):
    """The connection ended (or broke) before the announced body was in."""


def log_refusal(kind: str, message: str, *args: Any) -> None:
    held = _refusals.allow(kind)
    if held is not None:
        suffix = f" ({held} more not logged in the last {_refusals.every:g} s)" if held else ""
        log.warning(message + "%s", *args, suffix)


def _cooperative() -> bool:
    return bool(monkey.is_module_patched("socket"))


def _json_response(environ: dict[str, Any], start_response: StartResponse, status: str, code: ErrorCode,
                   message: str, *, close: bool = False, retry_after: int | None = None) -> Iterable[bytes]:
    body = json.dumps({"errorCode": code.value, "errorMessage": message}).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    if retry_after is not None:
        headers.append(("Retry-After", str(retry_after)))
    start_response(status, headers)
    return _ClosingBody(body, environ.get("gunicorn.socket") if close else None)


class _ClosingBody:
    """A response body that, once sent, shuts the connection down: gunicorn keeps a connection
    open whatever Connection header the app sets, and then drains the rest of a slow body."""

    def __init__(self, body: bytes, sock: Any) -> None:
        self._body = body
        self._sock = sock

    def __iter__(self) -> Iterator[bytes]:
        yield self._body

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):  # already gone
                self._sock.shutdown(socket.SHUT_RDWR)


def deadline_for(path: str) -> float:
    if path.startswith("/api/"):
        return float(settings.REQUEST_DEADLINE_SECONDS)
    if path == "/readyz":
        return float(settings.READYZ_DEADLINE_SECONDS)
    return float(settings.OTHER_REQUEST_DEADLINE_SECONDS)


def _read(stream: Any, size: int, timeout: float | None) -> bytes:
    if timeout is None:
        return bytes(stream.read(size))
    if timeout <= 0:
        raise BodyReadTimeout
    with gevent.Timeout(timeout, BodyReadTimeout):
        return bytes(stream.read(size))


def read_body(environ: dict[str, Any], limit: int, timeout: float | None) -> bytes | None:
    """The whole body (b"" when there is none), or None when it is larger than `limit`.

    Raises BodyReadTimeout when the client is slower than `timeout` seconds in all."""
    deadline = None if timeout is None else time.monotonic() + timeout
    stream = environ["wsgi.input"]
    chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
    length_header = environ.get("CONTENT_LENGTH") or ""
    if not chunked:
        try:
            length = int(length_header) if length_header else 0
        except ValueError:
            length = 0  # gunicorn refuses a malformed Content-Length itself; Django takes 0
        if length <= 0:
            return b""
        if length > limit:
            return None
    parts: list[bytes] = []
    size = 0
    want = limit + 1 if chunked else length
    while size < want:
        left = None if deadline is None else deadline - time.monotonic()
        try:
            part = _read(stream, min(65536, want - size), left)
        except (BodyReadTimeout, RequestDeadlineExceeded):
            raise
        except Exception as exc:  # gunicorn's NoMoreData, a bad chunk, a reset: no body to use
            raise BodyCutShort(f"{exc.__class__.__name__}: {exc}") from exc
        if not part:
            if not chunked:
                raise BodyCutShort(f"{size} of {length} bytes")
            break  # the end of a chunked body
        parts.append(part)
        size += len(part)
    if size > limit:
        return None
    return b"".join(parts)


def abandon_connections() -> None:
    """Close this request's database connections. One busy or inside a transaction is closed at
    the socket first, so nothing waits for a server that may not answer; its pool discards it."""
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is None:
            continue
        pgconn = getattr(raw, "pgconn", None)
        if pgconn is not None and pgconn.transaction_status != 0:  # not IDLE
            pgconn.finish()
        try:
            conn.close()
        except Exception:  # already gone: nothing more to release
            log.debug("closing an abandoned connection", exc_info=True)


class RequestGuard:
    """WSGI middleware: reads the body against its deadline, runs the app against its own."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        started = time.monotonic()
        cooperative = _cooperative()
        path = environ.get("PATH_INFO", "")
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            body = read_body(environ, limit, settings.BODY_READ_TIMEOUT_SECONDS if cooperative else None)
        except BodyReadTimeout:
            log_refusal("body-timeout", "request refused: 408, body not received within %s s (%s %s from %s)",
                        settings.BODY_READ_TIMEOUT_SECONDS, environ.get("REQUEST_METHOD"),
                        path.encode("unicode_escape").decode(), environ.get("REMOTE_ADDR"))
            return _json_response(environ, start_response, "408 Request Timeout", ErrorCode.INVALID_REQUEST,
                                  f"body: not received within {settings.BODY_READ_TIMEOUT_SECONDS} s", close=True)
        except BodyCutShort as exc:
            log_refusal("body-cut", "request refused: 400, body cut short (%s; %s %s from %s)", exc,
                        environ.get("REQUEST_METHOD"), path.encode("unicode_escape").decode(),
                        environ.get("REMOTE_ADDR"))
            return _json_response(environ, start_response, "400 Bad Request", ErrorCode.INVALID_REQUEST,
                                  "body: the connection ended before the body was complete", close=True)
        mark(Phase.APP)
        if body is None:
            return _json_response(environ, start_response, "413 Request Entity Too Large", ErrorCode.INVALID_REQUEST,
                                  f"body: larger than the limit of {limit} bytes (DATA_UPLOAD_MAX_MEMORY_SIZE)",
                                  close=True)
        environ["wsgi.input"] = _BodyStream(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        if not cooperative:
            return self.app(environ, start_response)
        deadline = deadline_for(path)
        remaining = deadline - (time.monotonic() - started)
        gate = _operator_gate if is_operator_request(path) else None
        if gate is not None and gate.waiting >= settings.OPERATOR_QUEUE_MAX and gate.semaphore().locked():
            log_refusal("operator-queue", "request refused: 503, %s operator requests already wait (%s %s from %s)",
                        gate.waiting, environ.get("REQUEST_METHOD"), path.encode("unicode_escape").decode(),
                        environ.get("REMOTE_ADDR"))
            return _json_response(environ, start_response, "503 Service Unavailable",
                                  ErrorCode.COORDINATOR_UNAVAILABLE,
                                  "too many admin requests at once on this node; retry later",
                                  retry_after=settings.DB_RETRY_AFTER_SECONDS, close=True)
        try:
            with gevent.Timeout(max(remaining, 0.001), RequestDeadlineExceeded):
                if gate is None:
                    return self.app(environ, start_response)
                semaphore = gate.semaphore()
                gate.waiting += 1
                try:
                    waiting.acquire(semaphore)
                finally:
                    gate.waiting -= 1
                try:
                    return self.app(environ, start_response)
                finally:
                    semaphore.release()
        except RequestDeadlineExceeded:
            abandon_connections()
            log_refusal("deadline", "request dropped: 503, not done within its deadline of %s s (%s %s)",
                        deadline, environ.get("REQUEST_METHOD"), path.encode("unicode_escape").decode())
            return _json_response(
                environ, start_response, "503 Service Unavailable", ErrorCode.COORDINATOR_UNAVAILABLE,
                f"the request was dropped, not applied: not done within {deadline:g} s "
                "(the coordinator's database may be unavailable); retry later",
                retry_after=settings.DB_RETRY_AFTER_SECONDS, close=True,
            )


class _BodyStream:
    """The body already read, as wsgi.input (Django's LimitedStream reads it by length)."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._body) if size is None or size < 0 else min(len(self._body), self._pos + size)
        data = self._body[self._pos:end]
        self._pos = end
        return data

    def readline(self, size: int = -1) -> bytes:
        newline = self._body.find(b"\n", self._pos)
        end = len(self._body) if newline < 0 else newline + 1
        if size is not None and size >= 0:
            end = min(end, self._pos + size)
        data = self._body[self._pos:end]
        self._pos = end
        return data
