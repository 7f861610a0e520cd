"""hash64 / shard math against the published vectors in docs/hash-test-vectors.json."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from dataplane.routing import (
    HASH_ALGORITHM,
    ShardKeys,
    hash64,
    hash_range,
    parse_shard_id,
    shard_index,
)

VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "docs" / "hash-test-vectors.json").read_text("utf-8")
)


def test_vectors_match_code() -> None:
    assert VECTORS["algorithm"] == HASH_ALGORITHM == "blake2b-64"
    assert len(VECTORS["vectors"]) >= 20
    keys = [v["key"] for v in VECTORS["vectors"]]
    assert "" in keys
    assert any(not k.isascii() for k in keys)
    for v in VECTORS["vectors"]:
        assert bytes.fromhex(v["utf8Hex"]) == v["key"].encode("utf-8")
        h = int(v["hash64"])
        assert hash64(v["key"]) == h, v["key"]
        # An independent reading of the definition: first 8 digest bytes, big-endian.
        digest = hashlib.blake2b(v["key"].encode("utf-8"), digest_size=8).digest()
        assert struct.unpack(">Q", digest)[0] == h
        for n, idx in v["index"].items():
            assert shard_index(h, int(n)) == idx, (v["key"], n)


def test_hash_ranges_match_vectors_and_tile_the_space() -> None:
    for n_str, ranges in VECTORS["hashRanges"].items():
        n = int(n_str)
        got = [hash_range(i, n) for i in range(n)]
        assert [[str(lo), str(hi)] for lo, hi in got] == ranges
        assert got[0][0] == 0
        assert got[-1][1] == 2**64
        assert all(got[i][1] == got[i + 1][0] for i in range(n - 1))


@given(st.integers(min_value=0, max_value=2**64 - 1), st.integers(min_value=1, max_value=1024))
def test_index_is_the_range_containing_the_hash(h: int, n: int) -> None:
    i = shard_index(h, n)
    lo, hi = hash_range(i, n)
    assert 0 <= i < n
    assert lo <= h < hi


def test_shard_keys_share_one_hash_tag() -> None:
    k = ShardKeys("orders:3:5")
    assert k.stream == "rsc:{orders:3:5}"
    assert k.sealed == "rsc:{orders:3:5}:sealed"
    assert k.fence("g") == "rsc:{orders:3:5}:fence:g"
    assert k.dlq("g") == "rsc:{orders:3:5}:dlq:g"
    assert k.idem("g", "m1") == "rsc:{orders:3:5}:idem:g:m1"
    assert ShardKeys("a:1:0", prefix="x").stream == "x:{a:1:0}"
    assert parse_shard_id("my:stream:3:5") == ("my:stream", 3, 5)
