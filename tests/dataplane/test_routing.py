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
    ShardVersion,
    document_versions,
    find_shard,
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


def derived(version: ShardVersion, index: int) -> dict[str, object]:
    keys = version.keys(index)
    return {
        "index": index,
        "shardId": keys.shard_id,
        "redisKey": keys.stream,
        "sealKey": keys.sealed,
        "hashRange": [str(x) for x in hash_range(index, version.shard_count)],
        "parents": version.parents(index),
    }


def test_i26_1_versions_derive_the_published_shards() -> None:
    """§3: a version's shape alone derives each shard's id, keys, hash range and parents, as
    docs/hash-test-vectors.json publishes them (16,384 shards over 4,096 parents included)."""
    assert len(VECTORS["versions"]) >= 4
    for case in VECTORS["versions"]:
        version = ShardVersion.from_document(case["version"], stream="ignored")
        assert version.document() == case["version"]  # the entry reads back as written
        for shard in case["shards"]:
            assert derived(version, shard["index"]) == shard
            # An independent reading of "parents": the parent version's overlapping ranges.
            lo, hi = (int(x) for x in shard["hashRange"])
            if version.parent_version is None:
                assert shard["parents"] == []
            else:
                n = version.parent_shard_count
                assert n is not None
                ranges = [hash_range(i, n) for i in range(n)]
                overlapping = [i for i, (plo, phi) in enumerate(ranges) if plo < hi and lo < phi]
                assert [parse_shard_id(p)[1:] for p in shard["parents"]] == [
                    (version.parent_version, i) for i in overlapping
                ]
    full = [c for c in VECTORS["versions"] if len(c["shards"]) == c["version"]["shardCount"]]
    assert full, "at least one version lists every shard"
    for case in full:
        version = ShardVersion.from_document(case["version"], stream="ignored")
        assert version.shard_ids() == [s["shardId"] for s in case["shards"]]


def test_i26_1_find_shard_only_names_shards_of_a_live_version() -> None:
    doc = {"stream": "my:s", "keyPrefix": "x", "versions": [
        {"version": 2, "state": "SEALED", "shardCount": 3, "parentVersion": None,
         "parentShardCount": None},
        {"version": 3, "state": "ACTIVE", "shardCount": 5, "parentVersion": 2,
         "parentShardCount": 3},
    ]}  # fmt: skip
    versions = document_versions(doc)
    assert [(v.stream, v.key_prefix) for v in versions] == [("my:s", "x"), ("my:s", "x")]
    found = find_shard(versions, "my:s:3:4")
    assert found is not None
    assert (found[0].version, found[1]) == (3, 4)
    assert found[0].keys(4).stream == "x:{my:s:3:4}"
    for other in ("my:s:3:5", "my:s:1:0", "s:3:0", "my:s:3:04", "my:s:3:-1", "nonsense"):
        assert find_shard(versions, other) is None, other


def test_i26_1_first_form_with_listed_shards_still_reads() -> None:
    """A coordinator of the first form listed every shard; a member reads it the same way."""
    entry = {"version": 2, "state": "ACTIVE", "shardCount": 2, "shards": [
        {"shardId": "s:2:0", "index": 0, "parents": ["s:1:0"]},
        {"shardId": "s:2:1", "index": 1, "parents": ["s:1:0"]},
    ]}  # fmt: skip
    version = ShardVersion.from_document(entry, stream="s", key_prefix="p")
    assert (version.parent_version, version.first, version.key_prefix) == (1, False, "p")
    assert version.shard_ids() == ["s:2:0", "s:2:1"]
