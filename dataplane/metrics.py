"""Member-side Prometheus metrics and the health endpoint (optional: ``pip install
'rsc-dataplane[metrics]'``, i.e. prometheus-client).

Only imported when a Consumer is built with ``metrics=True`` or ``metrics_port``: with metrics
off the library never imports ``prometheus_client`` and its hot path carries no counting at all.
With metrics on, the handler is wrapped (:meth:`Metrics.wrap`) to time and count each call;
the cold paths (retries, DLQ moves, refused reads, heartbeats) count where they happen.
Each Consumer has its own registry. docs/OBSERVABILITY.md has the member panel.
"""

from __future__ import annotations

import functools
import inspect
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from .errors import BatchItemsFailed

HEARTBEAT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        s = ["shard"]
        self.handled = Counter("rsc_member_messages_handled", "Messages handled", s, registry=r)
        self.failed = Counter("rsc_member_messages_failed", "Handler failures", s, registry=r)
        self.retried = Counter("rsc_member_messages_retried", "Messages run again", s, registry=r)
        self.dead_lettered = Counter(
            "rsc_member_messages_dead_lettered", "Messages moved to the DLQ", s, registry=r
        )
        self.handler_seconds = Histogram(
            "rsc_member_handler_seconds", "Handler call duration (a batch for a batch handler)",
            registry=r,
        )  # fmt: skip
        self.heartbeat_seconds = Histogram(
            "rsc_member_heartbeat_rtt_seconds", "Heartbeat round trip", buckets=HEARTBEAT_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.heartbeat_errors = Counter(
            "rsc_member_heartbeat_errors", "Heartbeats refused or failed, by errorCode",
            ["error_code"], registry=r,
        )  # fmt: skip
        self.fenced_reads_refused = Counter(
            "rsc_member_fenced_reads_refused", "Reads Redis refused: fence token moved on", s,
            registry=r,
        )  # fmt: skip
        self.in_flight = Gauge("rsc_member_in_flight", "Messages read, not finished", registry=r)
        self.owned_shards = Gauge("rsc_member_owned_shards", "Shards owned now", registry=r)
        self.since_heartbeat = Gauge(
            "rsc_member_seconds_since_last_heartbeat",
            "Seconds since the last accepted heartbeat (-1: none yet)", registry=r,
        )  # fmt: skip
        self.up = Gauge("rsc_member_healthy", "1 when /healthz answers 200", registry=r)
        self._server: ThreadingHTTPServer | None = None

    # ---- the handler ------------------------------------------------------------------------

    def wrap(self, handler: Callable[..., Any], *, batch: bool) -> Callable[..., Any]:
        """The handler, timed and counted per shard (only when metrics are on); `count` also
        observes the handler's time, so the sync and async wrappers share one epilogue."""
        observe, handled, failed = self.handler_seconds.observe, self.handled, self.failed
        # The handled counter's child per shard, found once: labels() takes a lock and builds
        # a key on every call, which was most of what metrics cost per message.
        handled_inc: dict[str, Callable[[float], None]] = {}

        def count(arg: Any, exc: BaseException | None, t0: float) -> None:
            observe(time.perf_counter() - t0)
            if batch:
                if not arg:
                    return
                shard, n = arg[0].shard, len(arg)
            else:
                shard, n = arg.shard, 1
            if exc is not None:
                bad = len(exc.failed) if isinstance(exc, BatchItemsFailed) else n
                failed.labels(shard).inc(bad)
                n -= bad
                if not n:
                    return
            inc = handled_inc.get(shard)
            if inc is None:
                inc = handled_inc[shard] = handled.labels(shard).inc
            inc(n)

        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)  # noqa: B004
        ):

            @functools.wraps(handler)
            async def timed_async(arg: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    result = await handler(arg)
                except BaseException as exc:
                    count(arg, exc, t0)
                    raise
                count(arg, None, t0)
                return result

            return timed_async

        @functools.wraps(handler)
        def timed(arg: Any) -> Any:
            t0 = time.perf_counter()
            try:
                result = handler(arg)
            except BaseException as exc:
                count(arg, exc, t0)
                raise
            count(arg, None, t0)
            return result

        return timed

    # ---- serving ----------------------------------------------------------------------------

    def serve(
        self,
        port: int,
        health: Callable[[], str | None],
        host: str = "0.0.0.0",  # noqa: S104
        status: Callable[[], dict[str, Any]] | None = None,
    ) -> int:
        """``/metrics``, ``/healthz`` (200 ``ok``, or 503 with the reason ``health`` gives) and
        ``/status`` (200, JSON ``{"healthy", "reason", "status"}``: ``status()`` is the
        ``Consumer.status()`` snapshot; what ``rsc-dataplane status`` prints) on a daemon
        thread; returns the port (0 picks a free one)."""
        metrics = self
        snapshot = status

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/healthz":
                    reason = health()
                    metrics.up.set(0 if reason else 1)
                    status, body, ctype = (503, reason, "text/plain") if reason else (
                        200, "ok", "text/plain")  # fmt: skip
                    data = (body + "\n").encode()
                elif self.path.split("?")[0] == "/metrics":
                    metrics.up.set(0 if health() else 1)
                    data, ctype = generate_latest(metrics.registry), CONTENT_TYPE_LATEST
                    status = 200
                elif self.path.split("?")[0] == "/status" and snapshot is not None:
                    reason = health()
                    doc = {"healthy": reason is None, "reason": reason, "status": snapshot()}
                    data, ctype = (json.dumps(doc) + "\n").encode(), "application/json"
                    status = 200
                else:
                    status, data, ctype = 404, b"not found\n", "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer((host, port), H)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="dp-metrics", daemon=True).start()
        return int(self._server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


__all__ = ["Metrics"]
