"""Fenced reads on a standalone server: new entries enter our PEL only while every shard's
fence token is ours, checked by Redis itself.

A read is a check and a transaction on the reader's own connection:

1. the check: ``WATCH`` the fence keys and ``MGET`` them;
2. for the shards whose token is ours: ``MULTI``, a non-blocking ``XREADGROUP``, then
   ``XREVRANGE ... COUNT 1`` of each stream (the IDs an empty read waits after), ``EXEC``.

``EXEC`` runs the read only if no watched fence key changed since the check, so a member that
stalls anywhere between its check and the read (GC, VM pause, SIGSTOP) reads nothing of a
shard whose next owner raised the token meanwhile. This is the optimistic form of a script
that checks and reads (``scripts.FENCED_READ``, used on Redis Cluster where the shards of one
read are in different slots): a script has to copy the whole reply through Lua, which costs
about half a raw read again on the server; the transaction returns it natively.

While entries flow, the check for the next read goes out in the same write as this read's
transaction (``EXEC`` ends the old ``WATCH``, the new one starts right after it): one round
trip per read. The guarantee is the same, only the gap between check and read is longer, and
whatever changes a token in that gap makes the next ``EXEC`` abort. A new set of shards gets
a check of its own first.

The tails are read inside the transaction, right after the read: if the read comes back
empty, everything up to them was delivered, and anything appended later has a higher ID, so
``XREAD BLOCK`` from them misses nothing. After a read that filled COUNT on every stream they
are left out (the streams are not at their end); should that next read come back empty, it
says so without tails and the read after it asks for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from ..wire import roundtrip
from .shard_table import ShardState


@dataclass(slots=True)
class ReadResult:
    refused: list[ShardState] = field(default_factory=list)  # fence token not ours: lost
    # {stream: [[id, [field, value, ...]], ...]}: as Redis sent them (the dispatcher makes
    # the dicts, in its one pass over the entries)
    entries: dict[str, list[Any]] = field(default_factory=dict)
    waits: dict[str, str] = field(default_factory=dict)  # nothing read: {stream: wait after}
    aborted: bool = False  # a fence moved between check and read: nothing read, look again


def _raise_first_error(replies: list[Any]) -> None:
    for reply in replies:
        if isinstance(reply, ResponseError):
            raise reply


class FencedReader:
    """Fenced reads on one connection, which nothing else uses. Make a new one with a new
    connection: the check it carries over lives in the old connection's ``WATCH``."""

    def __init__(self, conn: Any, group: str, consumer: str, count: int) -> None:
        self.conn = conn
        self.group = group
        self.consumer = consumer
        self.count = count
        self._checked: list[ShardState] | None = None  # shards the standing check covers
        self._tokens: list[Any] = []  # their tokens as the check saw them
        self._check_cmds: list[tuple[Any, ...]] = []  # the check of those shards
        self._flowing = False  # the last read filled COUNT on every stream: skip the tails

    def _covers(self, shards: list[ShardState]) -> bool:
        checked = self._checked
        return (
            checked is not None
            and len(checked) == len(shards)
            and all(a is b for a, b in zip(checked, shards, strict=True))
        )

    def _check(self, shards: list[ShardState]) -> None:
        self._checked = None
        fences = [st.keys.fence(self.group) for st in shards]
        self._check_cmds = [("WATCH", *fences), ("MGET", *fences)]
        replies = roundtrip(self.conn, [("UNWATCH",), *self._check_cmds])
        _raise_first_error(replies)
        self._checked, self._tokens = shards, replies[2]

    def unwatch(self) -> None:
        self._checked = None
        _raise_first_error(roundtrip(self.conn, [("UNWATCH",)]))

    def read(self, shards: list[ShardState]) -> ReadResult:
        """One fenced read of new entries of ``shards``. ``waits`` is empty when something
        was read, nothing was readable, or the read came back empty right after a full one
        (no tails asked for: read again at once, the next read asks for them)."""
        if not self._covers(shards):
            self._check(shards)
        result = ReadResult()
        readable: list[ShardState] = []
        for st, token in zip(shards, self._tokens, strict=True):
            (readable if token == st.token else result.refused).append(st)
        if not readable:
            self.unwatch()
            return result
        streams = [st.stream for st in readable]
        read: tuple[Any, ...] = ("XREADGROUP", "GROUP", self.group, self.consumer, "COUNT")
        read += (self.count, "STREAMS", *streams, *(">",) * len(streams))
        with_tails = not self._flowing
        tails = [("XREVRANGE", s, "+", "-", "COUNT", 1) for s in streams] if with_tails else []
        self._checked = None  # until the carried-over check below is known to have run
        commands = [("MULTI",), read, *tails, ("EXEC",), *self._check_cmds]
        replies = roundtrip(self.conn, commands)
        executed, watched, tokens = replies[-3:]
        _raise_first_error([*replies[:-3], watched, tokens])
        self._checked, self._tokens = shards, tokens
        self._flowing = False
        if isinstance(executed, ResponseError):
            raise executed
        if executed is None:
            result.aborted = True
            return result
        reply, *tail_replies = executed
        if isinstance(reply, ResponseError):
            raise reply
        if reply:
            items = reply.items() if isinstance(reply, dict) else reply
            result.entries = entries = {stream: got for stream, got in items if got}
            count = self.count
            self._flowing = len(entries) == len(streams) and all(
                len(got) >= count for got in entries.values()
            )
        elif with_tails:
            result.waits = {
                s: (tail[0][0] if tail else "0-0")
                for s, tail in zip(streams, tail_replies, strict=True)
            }
        return result
