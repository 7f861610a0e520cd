"""Many commands in one write on one connection, packed by hiredis when it is there.

The reader's fenced reads and the acker's ACK scripts send the same few commands per batch,
each carrying up to batch_size IDs; redis-py's pipeline would check every argument in Python
before handing it to hiredis, which costs more than the rest of an ACK round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.exceptions import ResponseError


def _hiredis_pack() -> Callable[[tuple[Any, ...]], bytes] | None:
    try:
        from hiredis import pack_command
    except ImportError:  # pragma: no cover - redis[hiredis] is a dependency
        return None
    return pack_command


_pack_command = _hiredis_pack()


def pack(conn: Any, commands: list[tuple[Any, ...]]) -> Any:
    """The wire form of ``commands`` for ``send_packed_command`` (str and int arguments)."""
    if _pack_command is None:
        return conn.pack_commands(commands)
    return [b"".join([_pack_command(c) for c in commands])]


def roundtrip(conn: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Send commands in one write and read every reply (an error reply is returned, not
    raised, so that the replies after it are still read off the connection)."""
    conn.send_packed_command(pack(conn, commands))
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(conn.read_response())
        except ResponseError as exc:
            replies.append(exc)
    return replies


class HeldConnection:
    """One connection of a client's pool, held by the one thread that uses it (the reader,
    the acker) instead of a pool checkout per round trip; dropped on any error, taken anew
    by the next :meth:`get`."""

    def __init__(self, client: Any, on_connect: Callable[[Any], None] | None = None) -> None:
        self.client = client
        self.on_connect = on_connect  # runs first on each new connection
        self.conn: Any = None

    def get(self) -> Any:
        if self.conn is None:
            conn = self.client.connection_pool.get_connection()
            try:
                if self.on_connect is not None:
                    self.on_connect(conn)
            except BaseException:
                self.client.connection_pool.release(conn)
                raise
            self.conn = conn
        return self.conn

    def roundtrip(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        try:
            return roundtrip(self.get(), commands)
        except BaseException:
            self.drop()
            raise

    def drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.disconnect()
            self.client.connection_pool.release(conn)
