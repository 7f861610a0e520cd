"""A TCP proxy under the test's control, for database outages a test can switch on and off.

Modes:
- PASS: bytes flow both ways.
- FREEZE: connections stay open and nothing flows (a server that hangs, a stalled network
  path behind a live TCP endpoint): TCP keepalives are answered, nothing else is.
- BLACK_HOLE: new connections are accepted and never answered; established ones freeze.
- REFUSE: every established connection is reset and new ones are reset at once (a database
  restarted or down behind a live host).
"""
from __future__ import annotations

import contextlib
import enum
import select
import socket
import struct
import threading
from collections.abc import Iterator


class Mode(enum.Enum):
    PASS = "pass"
    FREEZE = "freeze"
    BLACK_HOLE = "black hole"
    REFUSE = "refuse"


def _reset(sock: socket.socket) -> None:
    """Close with RST, as a dead server's host does."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


class TcpProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.mode = Mode.PASS
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.port: int = self._listener.getsockname()[1]
        self._pairs: list[tuple[socket.socket, socket.socket | None]] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._changed = threading.Condition()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def set_mode(self, mode: Mode) -> None:
        with self._changed:
            self.mode = mode
            self._changed.notify_all()
        if mode is Mode.REFUSE:
            with self._lock:
                pairs, self._pairs = self._pairs, []
            for client, server in pairs:
                _reset(client)
                if server is not None:
                    _reset(server)

    def close(self) -> None:
        self._stopped.set()
        self._listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, server in pairs:
            client.close()
            if server is not None:
                server.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            mode = self.mode
            if mode is Mode.REFUSE:
                _reset(client)
                continue
            if mode is Mode.BLACK_HOLE:
                with self._lock:
                    self._pairs.append((client, None))  # held open, never answered
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._pairs.append((client, server))
            thread = threading.Thread(target=self._pump, args=(client, server), daemon=True)
            thread.start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        try:
            while not self._stopped.is_set():
                if self.mode is not Mode.PASS:
                    with self._changed:  # frozen: wait for a change of mode, forward nothing
                        self._changed.wait(0.05)
                    if self.mode is Mode.REFUSE:
                        return
                    continue
                readable, _, _ = select.select(list(peers), [], [], 0.05)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except OSError:
            return
        finally:
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.close()


@contextlib.contextmanager
def tcp_proxy(upstream: tuple[str, int]) -> Iterator[TcpProxy]:
    proxy = TcpProxy(upstream)
    try:
        yield proxy
    finally:
        proxy.close()
