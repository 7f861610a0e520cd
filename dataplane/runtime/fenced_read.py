"""Fenced reads on a standalone server: new entries enter our PEL only while every shard's
fence token is ours, checked by Redis itself.

Two round trips on the reader's own connection:

1. ``WATCH`` the fence keys, ``MGET`` them, and ``XREVRANGE ... COUNT 1`` each stream (the
   IDs an empty read waits after);
2. for the shards whose token is ours: ``MULTI``, a non-blocking ``XREADGROUP``, ``EXEC``.

``EXEC`` runs the read only if no watched fence key changed since the check, so a member that
stalls anywhere between its checks and the read (GC, VM pause, SIGSTOP) reads nothing of a
shard whose next owner raised the token meanwhile. This is the optimistic form of a script
that checks and reads (``scripts.FENCED_READ``, used on Redis Cluster where the shards of one
read are in different slots): a script has to copy the whole reply through Lua, which costs
about half a raw read again on the server; the transaction returns it natively.

Tails are taken before the read: if the read then comes back empty, everything up to them was
delivered, and anything appended later has a higher ID, so ``XREAD BLOCK`` from them misses
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from .shard_table import ShardState


@dataclass(slots=True)
class ReadResult:
    refused: list[ShardState] = field(default_factory=list)  # fence token not ours: lost
    entries: dict[str, list[tuple[str, dict[str, str]]]] = field(default_factory=dict)
    waits: dict[str, str] = field(default_factory=dict)  # nothing read: {stream: wait after}
    aborted: bool = False  # a fence moved between check and read: nothing read, look again


def pairs(entries: list[Any]) -> list[tuple[str, dict[str, str]]]:
    """Raw stream entries (flat field lists) -> (id, {field: value})."""
    out = []
    for msg_id, flat in entries:
        it = iter(flat)
        out.append((msg_id, dict(zip(it, it))))  # noqa: B905 - pairs by construction
    return out


def _roundtrip(conn: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Send commands in one write and read every reply (an error reply is returned, not
    raised, so that the replies after it are still read off the connection)."""
    conn.send_packed_command(conn.pack_commands(commands))
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(conn.read_response())
        except ResponseError as exc:
            replies.append(exc)
    return replies


def fenced_read(
    conn: Any, group: str, consumer: str, count: int, shards: list[ShardState]
) -> ReadResult:
    """One fenced read of new entries of ``shards`` on connection ``conn`` (not shared)."""
    fences = [st.keys.fence(group) for st in shards]
    first: list[tuple[Any, ...]] = [("WATCH", *fences), ("MGET", *fences)]
    first += [("XREVRANGE", st.stream, "+", "-", "COUNT", 1) for st in shards]
    watched, tokens, *tails = _roundtrip(conn, first)
    for reply in (watched, tokens, *tails):
        if isinstance(reply, ResponseError):
            _roundtrip(conn, [("UNWATCH",)])
            raise reply
    result = ReadResult()
    readable: list[ShardState] = []
    for st, token in zip(shards, tokens, strict=True):
        (readable if token == st.token else result.refused).append(st)
    if not readable:
        _roundtrip(conn, [("UNWATCH",)])
        return result
    streams = [st.stream for st in readable]
    read = ("XREADGROUP", "GROUP", group, consumer, "COUNT", count, "STREAMS", *streams)
    read += (">",) * len(streams)
    _ok, queued, executed = _roundtrip(conn, [("MULTI",), read, ("EXEC",)])
    if isinstance(queued, ResponseError):
        raise queued
    if executed is None:
        result.aborted = True
        return result
    reply = executed[0]
    if isinstance(reply, ResponseError):
        raise reply
    if reply:
        items = reply.items() if isinstance(reply, dict) else reply
        result.entries = {stream: pairs(entries) for stream, entries in items if entries}
    if not result.entries:
        by_stream = {st.stream: tail for st, tail in zip(shards, tails, strict=True)}
        result.waits = {s: (by_stream[s][0][0] if by_stream[s] else "0-0") for s in streams}
    return result
