"""gunicorn's gevent worker, not exhaustible by clients that hold connections (issue 27.1).

The stock worker serves WORKER_CONNECTIONS connections and leaves the next ones in the listen
backlog, whatever the held ones do. 2,050 idle keep-alive clients, or 2,100 clients
trickling a request body, took every slot of a node, and new heartbeats got no answer. Here:

- each connection is in one phase: READING (a new connection, until its request line and
  headers are in), IDLE (served, waiting for its next request), BODY (its body is being
  read; `coordinator_project.wsgi_guard` reads it against BODY_READ_TIMEOUT_SECONDS) or APP
  (the application works on it);
- a new connection that finds every slot taken sheds one first: the connection idle the
  longest, else the one that has been READING or in BODY longest if that is over
  SHED_SLOW_AFTER_SECONDS. Connections in APP are never shed. With nothing to shed, the new
  connection is answered 503 at once (never left waiting in the backlog);
- one client address holds at most MAX_CONNECTIONS_PER_CLIENT connections per worker
  (CONNECTION_CAP_EXEMPT lists addresses without a cap: by default loopback, where a local
  reverse proxy or the benchmarks connect from);
- gunicorn's own refusals (a malformed request line or header) answer the API's JSON error
  body instead of an HTML page.

Shedding closes a connection the HTTP way for keep-alive: the client sees it closed and
opens a new one (the member library retries). Slots per worker: WORKER_CONNECTIONS; the
greenlet pool is a little larger, so a connection over the limit can be answered.
"""
from __future__ import annotations

import contextlib
import html
import json
import os
import re
import socket
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import gevent
from gunicorn.workers.ggevent import GeventWorker  # type: ignore[import-untyped]

from dataplane.protocol import ErrorCode
from webserver.compat import loop_iteration, use_response_class
from webserver.phases import Connection, Phase, connections
from webserver.response import Captured, OneWriteResponse


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def refusal_bytes(status: int, reason: str, code: ErrorCode, message: str, retry_after: int | None = None) -> bytes:
    body = json.dumps({"errorCode": code.value, "errorMessage": message}).encode()
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json", f"Content-Length: {len(body)}",
            "Connection: close"]
    if retry_after is not None:
        head.append(f"Retry-After: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


_STATUS_LINE = re.compile(rb"^HTTP/1\.1 (\d{3}) ([^\r\n]*)")
_HTML_MESSAGE = re.compile(rb"</h1>\s*(.*?)\s*</body>", re.S)


class GuardedGeventWorker(GeventWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = int(self.cfg.worker_connections)
        # The greenlet pool: room to answer (or shed for) connections over the limit.
        self.worker_connections = self.slots + max(32, self.slots // 10)
        self.max_per_client = int(os.environ.get("MAX_CONNECTIONS_PER_CLIENT", max(1, self.slots // 4)))
        self.exempt = {a.strip() for a in os.environ.get("CONNECTION_CAP_EXEMPT", "127.0.0.1,::1").split(",")
                       if a.strip()}
        self.shed_slow_after = _env_float("SHED_SLOW_AFTER_SECONDS", 1.0)
        self.per_client: Counter[str] = Counter()
        self._refusals: dict[str, tuple[float, int]] = {}

    def init_process(self) -> None:
        use_response_class(OneWriteResponse)  # a head and its body in one write (decision 0025)
        super().init_process()

    # --- admission ----------------------------------------------------------------------------
    def _victim(self, newcomer: str) -> Connection | None:
        """The connection to close for a newcomer from address `newcomer`, if any may go.

        Addresses holding more connections give them up first, so a few addresses that hold
        many cannot keep others out, however fast they reconnect: first a connection of an
        address holding more than the newcomer's (idle ones first), then the longest idle
        connection of an address holding at least as many as the newcomer's, then one that
        has been reading its request for more than SHED_SLOW_AFTER_SECONDS."""
        now = time.monotonic()
        open_ = [c for c in connections.values() if not c.shed and c.phase is not Phase.APP]
        if not open_:
            return None
        held = Counter(c.address for c in open_)
        mine = held[newcomer]
        crowded = [c for c in open_ if held[c.address] > mine + 1]
        if crowded:
            return max(crowded, key=lambda c: (c.phase is Phase.IDLE, held[c.address], now - c.since))
        idle = [c for c in open_ if c.phase is Phase.IDLE and held[c.address] >= mine]
        if idle:
            return max(idle, key=lambda c: now - c.since)
        slow = [c for c in open_ if c.phase is not Phase.IDLE and now - c.since >= self.shed_slow_after]
        return max(slow, key=lambda c: now - c.since) if slow else None

    def _refuse(self, client: socket.socket, why: str) -> None:
        with contextlib.suppress(OSError):
            client.sendall(refusal_bytes(503, "Service Unavailable", ErrorCode.COORDINATOR_UNAVAILABLE,
                                         f"{why}; retry later", retry_after=1))
            client.shutdown(socket.SHUT_WR)
        self._log_refusal(why)

    def _log_refusal(self, why: str) -> None:
        """One warning line per kind of refusal per 10 s, with the count held back."""
        now = time.monotonic()
        last, held = self._refusals.get(why, (0.0, -1))
        if held >= 0 and now - last < 10.0:
            self._refusals[why] = (last, held + 1)
            return
        suffix = f" ({held} more not logged in the last 10 s)" if held > 0 else ""
        self._refusals[why] = (now, 0)
        self.log.warning("connection refused: 503, %s%s", why, suffix)

    def handle(self, listener: Any, client: socket.socket, addr: Any) -> None:
        address = addr[0] if isinstance(addr, tuple) and addr else ""
        capped = bool(address) and address not in self.exempt and self.max_per_client > 0
        if capped and self.per_client[address] >= self.max_per_client:
            self._refuse(client, f"too many connections from this address (at most {self.max_per_client})")
            client.close()
            return
        live = sum(1 for c in connections.values() if not c.shed)
        if live >= self.slots:
            victim = self._victim(address)
            if victim is None:
                self._refuse(client, "the server is at its connection limit")
                client.close()
                return
            victim.close_now()
        conn = Connection(client, address)
        me = gevent.getcurrent()
        connections[me] = conn
        if capped:
            self.per_client[address] += 1
        try:
            super().handle(listener, client, addr)
        finally:
            connections.pop(me, None)
            if capped:
                self.per_client[address] -= 1
                if self.per_client[address] <= 0:
                    del self.per_client[address]

    # --- phases -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def timeout_ctx(self) -> Iterator[None]:
        """Around the wait for the next request's line and headers (gunicorn's keep-alive loop)."""
        conn = connections.get(gevent.getcurrent())
        if conn is not None:
            conn.enter(Phase.IDLE if conn.served else Phase.READING)
        # False: the timeout ends the block silently (gevent's documented form; types-gevent
        # only admits an exception).
        with gevent.Timeout(self.cfg.keepalive, False):  # type: ignore[arg-type]
            yield
        if conn is not None:
            conn.enter(Phase.BODY)

    def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> None:
        conn = connections.get(gevent.getcurrent())
        try:
            super().handle_request(listener_name, req, sock, addr)
        finally:
            if conn is not None:
                conn.served += 1
        # Answered and kept open (gunicorn raises StopIteration to close the connection).
        if conn is not None:
            self._end_turn(conn)

    def _end_turn(self, conn: Connection) -> None:
        """A connection whose requests keep arriving and never wait for I/O (pipelined or
        back-to-back requests answered without the database: refusals, /healthz) would keep
        this worker to itself: gevent switches greenlets only when one waits, so every other
        connection, and the accept of new ones, waited until it stopped (one connection
        pipelining 3,000 unauthenticated heartbeats held a worker for 2 s). So a request after
        which the event loop has not polled since this connection's last turn yields, once, to
        the others. A heartbeat waits for its group read anyway: it never yields here."""
        hub = gevent.get_hub()
        iteration = loop_iteration(hub.loop)
        if iteration == conn.loop_seen:
            # A timer due at once, not sleep(0): that resumes this greenlet among the ready
            # callbacks, before the loop polls; the timer fires after a (non-blocking) poll,
            # so the other connections' ready requests are taken first.
            timer = hub.loop.timer(0)
            try:
                hub.wait(timer)
            finally:
                timer.close()
            iteration = loop_iteration(hub.loop)
        conn.loop_seen = iteration

    # --- gunicorn's own errors as JSON --------------------------------------------------------
    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        conn = connections.get(gevent.getcurrent())
        if conn is not None and conn.shed:
            return  # we closed it ourselves: nothing to answer, nothing to log
        captured = Captured()
        super().handle_error(req, captured, addr, exc)
        status = _STATUS_LINE.match(captured.data)
        if status is None:
            return
        code = int(status.group(1))
        found = _HTML_MESSAGE.search(captured.data)
        message = html.unescape(found.group(1).decode("latin-1")) if found else ""
        reason = status.group(2).decode("latin-1")
        error = ErrorCode.INTERNAL_ERROR if code >= 500 else ErrorCode.INVALID_REQUEST
        with contextlib.suppress(OSError):
            client.sendall(refusal_bytes(code, reason, error, f"request: {message or reason}"))
