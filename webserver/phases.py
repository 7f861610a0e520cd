"""Where each connection of a gevent worker is (webserver.worker sheds by it):
a module of its own, so the WSGI layer can report a request's phase without importing gunicorn."""
from __future__ import annotations

import contextlib
import enum
import socket
import time
from typing import Any

import gevent


class Phase(enum.Enum):
    READING = "reading"
    IDLE = "idle"
    BODY = "body"
    APP = "app"


class Connection:
    __slots__ = ("address", "client", "loop_seen", "phase", "served", "shed", "since")

    def __init__(self, client: socket.socket, address: str) -> None:
        self.client = client
        self.address = address
        self.phase = Phase.READING
        self.since = time.monotonic()
        self.served = 0
        self.shed = False
        self.loop_seen = -1  # the event loop's iteration when this connection last had its turn

    def enter(self, phase: Phase) -> None:
        self.phase = phase
        self.since = time.monotonic()

    def close_now(self) -> None:
        """Ends the connection from another greenlet: its pending read returns end-of-file, so
        its own greenlet unwinds the ordinary way and frees the slot."""
        self.shed = True
        # The real socket's shutdown: gevent's own would raise EBADF into the reader (a logged
        # traceback); this way the reader just sees end-of-file.
        with contextlib.suppress(OSError):
            getattr(self.client, "_sock", self.client).shutdown(socket.SHUT_RDWR)


# The connection served by each greenlet of this process (one worker per process).
connections: dict[Any, Connection] = {}


def mark(phase: Phase) -> None:
    """Called by the WSGI layer (wsgi_guard) to say where the current request is; outside the
    guarded worker (tests, sync workers) there is nothing to mark."""
    conn = connections.get(gevent.getcurrent())
    if conn is not None:
        conn.enter(phase)
