"""Range partitioning of the 64-bit key hash (PROTOCOL.md §2) and reshard parent links.

Shard i of n owns the hashes h with floor(h*n / 2^64) == i, i.e. [ceil(i*2^64/n),
ceil((i+1)*2^64/n)). The hash itself (blake2b-64) lives in `dataplane.routing`, which
producers use; the coordinator only needs the ranges.
"""
from __future__ import annotations

SPACE = 1 << 64


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def hash_range(index: int, shard_count: int) -> tuple[int, int]:
    if not 0 <= index < shard_count:
        raise ValueError(f"index {index} outside 0..{shard_count - 1}")
    return _ceil_div(index * SPACE, shard_count), _ceil_div((index + 1) * SPACE, shard_count)


def shard_index(hash64: int, shard_count: int) -> int:
    return (hash64 * shard_count) >> 64


def parent_indexes(index: int, new_count: int, old_count: int) -> list[int]:
    """Indexes of the old version's shards whose ranges overlap new shard `index`."""
    lo, hi = hash_range(index, new_count)
    first = shard_index(lo, old_count)
    last = shard_index(hi - 1, old_count)
    return list(range(first, last + 1))


def shard_id(stream: str, version: int, index: int) -> str:
    return f"{stream}:{version}:{index}"
