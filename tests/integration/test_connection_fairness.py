"""One connection's requests do not keep a worker to themselves (webserver.worker._end_turn).

gevent switches greenlets only when one waits. A request answered without waiting for I/O (a
refusal before any lookup, /healthz) never waits, and a client that pipelines such requests
keeps its greenlet reading and answering them back to back: every other connection of the
worker, and the accept of new ones, waited until the pipeline was drained (3,000 pipelined
unauthenticated heartbeats held a worker for 2 s). No key is needed to do that.

The test pipelines refused heartbeats on one connection to a one-worker server, reading the
answers as they come, and asks /healthz on a new connection while the pipeline is being
answered: the probe must be answered before the pipeline is. Seen failing without the turn
(the probe answered only after all of the pipeline's answers).
"""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from tests import plain_http

from .conftest import running_gunicorn

pytestmark = [pytest.mark.slow, pytest.mark.needs_postgres]

PIPELINED = 2_000  # 0.3-0.7 ms each: answering the pipeline takes most of a second or more
STATUS_LINE = b"HTTP/1.1 "


def _refused_heartbeat() -> bytes:
    body = b"{}"
    return (b"POST /api/v1/groups/fair/heartbeat HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer rsc_not-a-key\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


def test_i27_1_a_connection_pipelining_refused_requests_does_not_hold_the_worker_from_others(
        transactional_db: None, tmp_path: Path):
    with running_gunicorn(workers=1, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus")) as server:
        port = int(server.url.rsplit(":", 1)[1])
        flood = socket.create_connection(("127.0.0.1", port))
        answered = 0
        drained = threading.Event()
        first = threading.Event()

        def read_answers() -> None:
            nonlocal answered
            tail = b""
            while answered < PIPELINED:
                data = flood.recv(1 << 16)
                if not data:
                    break
                # Each answer starts with its status line. The previous read's last 8 bytes
                # complete a line cut between reads, and cannot hold a whole one themselves.
                seen = tail + data
                answered += seen.count(STATUS_LINE)
                tail = seen[-(len(STATUS_LINE) - 1):]
                first.set()
            drained.set()

        reader = threading.Thread(target=read_answers, daemon=True)
        reader.start()
        try:
            flood.sendall(_refused_heartbeat() * PIPELINED)
            assert first.wait(30), "no answer to the pipeline"
            # The worker is busy with the pipeline now; a new connection's request.
            started = time.monotonic()
            probe = plain_http.get(f"{server.url}/healthz", timeout=60)
            probe_s = time.monotonic() - started
            seen_then = answered
            assert probe.status_code == 200
            assert drained.wait(120), f"the pipeline was not answered: {answered} of {PIPELINED}"
        finally:
            flood.close()
            reader.join(5)
        assert answered == PIPELINED, answered
        # Without the turn the probe waited for the whole pipeline (seen_then == PIPELINED).
        assert seen_then < PIPELINED, (
            f"/healthz was answered only after all {PIPELINED} pipelined requests ({probe_s:.2f} s)")
