"""Dead-letter tools: list, replay and purge a group's DLQ streams (issue 10.5).

The runtime moves a message that failed ``max_deliveries`` times to the DLQ stream of its
shard and group, ``<prefix>:{<shardId>}:dlq:<group>`` (``ShardKeys.dlq``), as one entry with
``dlq:error``, ``dlq:deliveries``, ``dlq:id`` (its id on the shard), ``dlq:shard``,
``dlq:group``, then the message's own fields (key field included).

Which DLQ streams exist: the shards of the live versions (the routing document) plus, found
with SCAN, those of retired versions (their keys stay in Redis; routing no longer names them).

``replay`` re-appends each entry's own fields through ``Producer.send_many``: routed by its
key on the stream's *current* write version, seal-aware, so after a reshard a replayed message
lands where its key lives now. An entry is deleted from the DLQ only after its append
succeeded, page by page: a crash mid-replay can duplicate a message, never lose one.
Each call works on the entries present when it starts, so a message that fails again during a
replay goes back to the DLQ and is not replayed twice by the same call.

Only the DLQ's own group handles a replay (issue 27.7): the appended entry carries
``dlq:replay-for = <group>`` (``message.REPLAY_FOR``), and members of every other group on the
stream ACK it without running their handler (they still read it: one entry each). Members of
the other groups must run a library that knows the field (rsc-dataplane with issue 27.7);
an older one handles the replay like any message. Per-key order: a replayed message is
appended at the end of its key's current shard, so its group handles it after every message
of that key appended before the replay — including those that followed the original.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .message import REPLAY_FOR
from .preflight import PreflightError, describe_group, stream_routing
from .producer import Producer, Sent
from .routing import DEFAULT_KEY_PREFIX, ShardKeys, document_versions, parse_shard_id

# The fields the runtime adds to a dead letter (runtime ``_to_dlq``); everything else is the
# message's own.
DLQ_ERROR, DLQ_DELIVERIES, DLQ_ID, DLQ_SHARD, DLQ_GROUP = (
    "dlq:error",
    "dlq:deliveries",
    "dlq:id",
    "dlq:shard",
    "dlq:group",
)
# REPLAY_FOR too: a replay that failed again is tagged anew by the next replay.
_RUNTIME_FIELDS = frozenset((DLQ_ERROR, DLQ_DELIVERIES, DLQ_ID, DLQ_SHARD, DLQ_GROUP, REPLAY_FOR))
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def _glob_escape(text: str) -> str:
    return _GLOB_SPECIAL.sub(r"\\\1", text)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One DLQ entry. ``id`` is its id in the DLQ stream; ``source_id`` the message's id on
    its shard; ``key`` the key field's value (the source id where the field is missing, as
    the runtime does for keyless messages); ``fields`` the message's own fields."""

    shard: str
    id: str
    source_id: str
    error: str
    deliveries: int
    key: str
    fields: dict[str, str] = field(repr=False)

    @classmethod
    def from_entry(
        cls, shard: str, entry_id: str, raw: dict[str, str], key_field: str
    ) -> DeadLetter:
        fields = {k: v for k, v in raw.items() if k not in _RUNTIME_FIELDS}
        source_id = raw.get(DLQ_ID, "")
        try:
            deliveries = int(raw.get(DLQ_DELIVERIES, "0"))
        except ValueError:
            deliveries = 0
        return cls(
            shard=raw.get(DLQ_SHARD, shard),
            id=entry_id,
            source_id=source_id,
            error=raw.get(DLQ_ERROR, ""),
            deliveries=deliveries,
            key=fields.get(key_field, source_id),
            fields=fields,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "id": self.id,
            "sourceId": self.source_id,
            "error": self.error,
            "deliveries": self.deliveries,
            "key": self.key,
            "fields": self.fields,
        }


class DeadLetters:
    """The DLQ of one group. The API key is the group's (it may read the stream's routing).

    Raises ``PreflightError`` (with the CLI's exit code) when the coordinator refuses the key
    or does not know the group.
    """

    def __init__(
        self,
        coordinator_url: str,
        group: str,
        api_key: str | None,
        redis_url: str = "redis://127.0.0.1:6379/0",
        *,
        key_field: str = "key",
        cluster: bool = False,
        page_size: int = 500,
        client: Any = None,
    ) -> None:
        self.group = group
        self.key_field = key_field
        self.page_size = max(1, page_size)
        self.stream: str = describe_group(coordinator_url, api_key, group)["stream"]
        self._routing = stream_routing(coordinator_url, api_key, self.stream)
        self.prefix: str = self._routing.get("keyPrefix") or DEFAULT_KEY_PREFIX
        # Replays go through the producer path; its Redis client serves the DLQ reads too.
        self.producer = Producer(
            coordinator_url,
            self.stream,
            api_key,
            redis_url,
            key_field=key_field,
            cluster=cluster,
            client=client,
        )
        self.client: Any = self.producer.client

    def close(self) -> None:
        self.producer.close()

    def __enter__(self) -> DeadLetters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- where ---------------------------------------------------------------------------

    def dlq_key(self, shard: str) -> str:
        return ShardKeys(shard, self.prefix).dlq(self.group)

    def _check_shard(self, shard: str) -> str:
        try:
            stream, _version, _index = parse_shard_id(shard)
        except ValueError:
            stream = None
        if stream != self.stream:
            raise PreflightError(
                f"shard {shard!r} is not a shard of stream {self.stream!r} "
                f"(group {self.group!r}); shard ids look like {self.stream}:1:0"
            )
        return shard

    def shards(self) -> list[str]:
        """Shards whose DLQ stream of this group exists, oldest version first."""
        found = {s for v in document_versions(self._routing) for s in v.shard_ids()}
        head, tail = f"{self.prefix}:{{", f"}}:dlq:{self.group}"
        pattern = f"{_glob_escape(head)}{_glob_escape(self.stream)}:*{_glob_escape(tail)}"
        for key in self.client.scan_iter(match=pattern, count=1000, _type="stream"):
            if key.startswith(head) and key.endswith(tail):
                shard = key[len(head) : -len(tail)]
                try:
                    if parse_shard_id(shard)[0] == self.stream:  # not stream "<ours>:x"
                        found.add(shard)
                except ValueError:
                    continue
        ordered = sorted(found, key=lambda s: parse_shard_id(s)[1:])
        return [s for s, n in zip(ordered, self._lengths(ordered), strict=True) if n]

    def _lengths(self, shards: list[str]) -> list[int]:
        pipe = self.client.pipeline(transaction=False)
        for s in shards:
            pipe.xlen(self.dlq_key(s))
        return [int(n) for n in pipe.execute()] if shards else []

    def _selected(self, shard: str | None) -> list[str]:
        return [self._check_shard(shard)] if shard is not None else self.shards()

    def counts(self, shard: str | None = None) -> dict[str, int]:
        """DLQ length per shard (shards with an empty or no DLQ are left out)."""
        shards = self._selected(shard)
        return {s: n for s, n in zip(shards, self._lengths(shards), strict=True) if n}

    # ---- reading -------------------------------------------------------------------------

    def _pages(self, shard: str, limit: int | None) -> Iterator[list[DeadLetter]]:
        """The entries present now, oldest first, in pages; stops at the newest entry seen at
        the start, so entries added meanwhile (a replay failing again) are not revisited."""
        key = self.dlq_key(shard)
        newest = self.client.xrevrange(key, count=1)
        if not newest:
            return
        end, start, seen = newest[0][0], "-", 0
        while limit is None or seen < limit:
            count = self.page_size if limit is None else min(self.page_size, limit - seen)
            entries = self.client.xrange(key, min=start, max=end, count=count)
            if not entries:
                return
            seen += len(entries)
            start = f"({entries[-1][0]}"
            yield [DeadLetter.from_entry(shard, eid, raw, self.key_field) for eid, raw in entries]

    def _walk(self, shard: str | None, limit: int | None) -> Iterator[tuple[str, list[DeadLetter]]]:
        left = limit
        for s in self._selected(shard):
            for page in self._pages(s, left):
                yield s, page
                if left is not None:
                    left -= len(page)
            if left is not None and left <= 0:
                return

    # ---- acting --------------------------------------------------------------------------

    def replay(
        self, shard: str | None = None, limit: int | None = None
    ) -> list[tuple[DeadLetter, Sent]]:
        """Re-append dead letters through the producer path, tagged for this group only,
        then delete them from the DLQ.

        Returns each replayed letter with where it was appended now.
        """
        done: list[tuple[DeadLetter, Sent]] = []
        for s, page in self._walk(shard, limit):
            sent = self.producer.send_many(
                [(letter.key, {**letter.fields, REPLAY_FOR: self.group}) for letter in page]
            )
            # Only now: a crash before this line leaves them in the DLQ (a duplicate on the
            # next replay), never lost.
            self.client.xdel(self.dlq_key(s), *[letter.id for letter in page])
            done.extend(zip(page, sent, strict=True))
        return done

    def purge(self, shard: str | None = None, limit: int | None = None) -> int:
        """Delete dead letters (all, or the oldest ``limit``); returns how many."""
        n = 0
        for s, page in self._walk(shard, limit):
            n += int(self.client.xdel(self.dlq_key(s), *[letter.id for letter in page]))
        return n

    # Last in the class body: the name ``list`` would shadow the builtin for the annotations
    # of methods defined after it.
    def list(self, shard: str | None = None, limit: int | None = None) -> list[DeadLetter]:
        """Dead letters, oldest version and shard first, each shard's oldest first."""
        return [letter for _s, page in self._walk(shard, limit) for letter in page]


__all__ = ["DeadLetter", "DeadLetters"]
