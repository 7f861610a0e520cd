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


def roundtrip_pooled(client: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """:func:`roundtrip` on a connection of ``client``'s pool (standalone), dropped on error."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        return roundtrip(conn, commands)
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
