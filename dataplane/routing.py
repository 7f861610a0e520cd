"""Stable key hashing, shard math, reshard parent links and Redis key names (PROTOCOL.md §2).

The one home of these for both sides: the coordinator imports them from here (its metadata
documents, resharding and housekeeping), producers route with them. Dependency-free on
purpose: a producer in another language must be able to re-implement this file from its
docstrings. The protocol's other words are in ``protocol``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

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
