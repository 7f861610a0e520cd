"""Stable key hashing, shard math, reshard parent links and Redis key names (PROTOCOL.md §2).

The one home of these for both sides: the coordinator imports them from here (its metadata
documents, resharding and housekeeping), producers route with them. Dependency-free on
purpose: a producer in another language must be able to re-implement this file from its
docstrings. The protocol's other words are in ``protocol``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

HASH_ALGORITHM = "blake2b-64"
DEFAULT_KEY_PREFIX = "rsc"
_TWO_64 = 1 << 64


def hash64(key: str) -> int:
    """BLAKE2b (digest_size=8) of the UTF-8 key, read as a big-endian unsigned 64-bit int."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")


def shard_index(h: int, shard_count: int) -> int:
    """Range partitioning: shard i of n owns the hashes h with floor(h * n / 2**64) == i.

    Range (not modulo) partitioning is what lets a child version's shard name its parents as
    the parent shards whose hash ranges overlap its own.
    """
    return (h * shard_count) >> 64


def hash_range(index: int, shard_count: int) -> tuple[int, int]:
    """The half-open hash range [lo, hi) of shard ``index`` of ``shard_count``.

    lo = ceil(index * 2**64 / n), hi = ceil((index + 1) * 2**64 / n); the last hi is 2**64.
    """
    if not 0 <= index < shard_count:
        raise ValueError(f"shard index {index} out of range for {shard_count} shards")
    lo = -((-index * _TWO_64) // shard_count)
    hi = -((-(index + 1) * _TWO_64) // shard_count)
    return lo, hi


def shard_for_key(key: str, shard_count: int) -> int:
    return shard_index(hash64(key), shard_count)


def parent_indexes(index: int, new_count: int, old_count: int) -> list[int]:
    """The parents of shard ``index`` of a new version of ``new_count`` shards: the indexes of
    the old version's ``old_count`` shards whose hash ranges overlap its range."""
    lo, hi = hash_range(index, new_count)
    return list(range(shard_index(lo, old_count), shard_index(hi - 1, old_count) + 1))


def shard_id(stream: str, version: int, index: int) -> str:
    return f"{stream}:{version}:{index}"


def parse_shard_id(value: str) -> tuple[str, int, int]:
    """Split ``"<stream>:<version>:<index>"``; the stream name itself may contain colons."""
    stream, version, index = value.rsplit(":", 2)
    return stream, int(version), int(index)


# As a sort key, the parsed id gives the natural order: orders:3:10 after orders:3:9.
shard_sort_key = parse_shard_id


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """Every Redis key of one shard, hash-tagged with the whole shard id so they share a slot.

    Sharing the slot is what allows one Lua script to touch the stream, its seal marker, its
    fence token, DLQ and idempotency markers atomically, also on Redis Cluster.
    """

    shard_id: str
    prefix: str = DEFAULT_KEY_PREFIX

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{self.shard_id}}}"

    @property
    def stream(self) -> str:
        return self.base

    @property
    def sealed(self) -> str:
        return f"{self.base}:sealed"

    def fence(self, group: str) -> str:
        return f"{self.base}:fence:{group}"

    def dlq(self, group: str) -> str:
        return f"{self.base}:dlq:{group}"

    def idem(self, group: str, marker: str) -> str:
        return f"{self.base}:idem:{group}:{marker}"


# ---- a shard version as the metadata describes it (PROTOCOL.md §3) ---------------------------
# The coordinator's metadata and routing documents describe each live version by these fields
# alone; every shard's id, keys, hash range and parents follow from them with the rules above,
# so the documents stay a few hundred bytes per version whatever the shard count.
@dataclass(frozen=True, slots=True)
class ShardVersion:
    """One shard version: ``stream``, ``version``, ``state``, ``shardCount``, the version its
    shards' parents belong to (``parentVersion``, null for a stream's first version) with that
    version's ``parentShardCount``, and the stream's ``keyPrefix``."""

    stream: str
    version: int
    shard_count: int
    state: str = "ACTIVE"
    parent_version: int | None = None
    parent_shard_count: int | None = None
    key_prefix: str = DEFAULT_KEY_PREFIX

    def shard_id(self, index: int) -> str:
        if not 0 <= index < self.shard_count:
            raise ValueError(f"shard index {index} out of range for {self.shard_count} shards")
        return shard_id(self.stream, self.version, index)

    def shard_ids(self) -> list[str]:
        return [shard_id(self.stream, self.version, i) for i in range(self.shard_count)]

    def index_of(self, shard: str) -> int | None:
        """The index of ``shard`` in this version, None if it is not one of its shards."""
        try:
            stream, version, index = parse_shard_id(shard)
        except ValueError:
            return None
        if stream != self.stream or version != self.version or not 0 <= index < self.shard_count:
            return None
        # "orders:3:07" parses as index 7 but is not the id of shard 7.
        return index if shard_id(stream, version, index) == shard else None

    def keys(self, index: int) -> ShardKeys:
        return ShardKeys(self.shard_id(index), self.key_prefix)

    def parents(self, index: int) -> list[str]:
        """Shard ids of the parent version whose hash ranges overlap shard ``index``."""
        if self.parent_version is None or self.parent_shard_count is None:
            return []
        return [
            shard_id(self.stream, self.parent_version, p)
            for p in parent_indexes(index, self.shard_count, self.parent_shard_count)
        ]

    @property
    def first(self) -> bool:
        """A stream's first version: its shards have no parents (a group's start position
        applies to them; child versions are read from their start)."""
        return self.parent_version is None

    def document(self) -> dict[str, object]:
        """This version's entry in the metadata and routing documents."""
        return {
            "stream": self.stream,
            "version": self.version,
            "state": self.state,
            "shardCount": self.shard_count,
            "parentVersion": self.parent_version,
            "parentShardCount": self.parent_shard_count,
            "keyPrefix": self.key_prefix,
        }

    @classmethod
    def from_document(
        cls, entry: Mapping[str, Any], stream: str, key_prefix: str = DEFAULT_KEY_PREFIX
    ) -> ShardVersion:
        """Read a version entry; ``stream`` and ``key_prefix`` are the document's, for entries
        that do not repeat them. Also reads the first form, which listed every shard (its ids
        and keys follow the same rules): its parent version is the one before, if any shard
        named parents."""
        version = int(entry["version"])
        parent_version = entry.get("parentVersion")
        parent_count = entry.get("parentShardCount")
        old_form = "parentVersion" not in entry and entry.get("shards")
        if old_form and any(s.get("parents") for s in entry["shards"]):
            parent_version = version - 1
        return cls(
            stream=str(entry.get("stream") or stream),
            version=version,
            shard_count=int(entry["shardCount"]),
            state=str(entry.get("state") or "ACTIVE"),
            parent_version=None if parent_version is None else int(parent_version),
            parent_shard_count=None if parent_count is None else int(parent_count),
            key_prefix=str(entry.get("keyPrefix") or key_prefix),
        )


def document_versions(doc: Mapping[str, Any]) -> list[ShardVersion]:
    """The live versions of a metadata (§3) or routing (§6) document, oldest first."""
    stream = str(doc.get("stream") or "")
    prefix = str(doc.get("keyPrefix") or DEFAULT_KEY_PREFIX)
    return [ShardVersion.from_document(v, stream, prefix) for v in doc.get("versions") or ()]


def find_shard(versions: Iterable[ShardVersion], shard: str) -> tuple[ShardVersion, int] | None:
    """The version holding ``shard`` and its index there, None if no version does."""
    for v in versions:
        index = v.index_of(shard)
        if index is not None:
            return v, index
    return None
