"""Loopback ports for the tests: a free one for a server a test starts, and one where nothing
listens (no Django here: the data plane's tests use these too)."""
from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port where a connection is refused for as long as this lasts: bound, never
    listening, so no other process can listen there meanwhile. A port that was merely free
    was taken once by another xdist worker's coordinator, and a CLI run meant to find no
    coordinator found one that answered 404 (seen 2026-12-07)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def free_port() -> int:
    """A port free now, for a server the test starts: another xdist worker's server may take it
    first (start_gunicorn checks). For "nothing listens there", `refused_port`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
