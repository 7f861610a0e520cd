"""Issue 26.1: the metadata (§3) and routing (§6) documents describe each live shard version by
its shape, not its shards; what the coordinator stores is what a member derives from them."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from dataplane.routing import ShardVersion, document_versions
from groups.metadata import group_metadata, routing_document
from groups.models import Group, Shard, Stream
from groups.resharding import start_reshard
from tests.redis_keys import delete_stream_keys

from .conftest import Hb, make_group

pytestmark = [pytest.mark.needs_postgres, pytest.mark.django_db(transaction=True, databases=["default", "liveness"])]

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "docs" / "hash-test-vectors.json").read_text("utf-8"))


def stored(stream: str) -> dict[str, list[Any]]:
    """Each stored shard's (id, parents) by shard id, as the coordinator's resharding wrote them."""
    return {sid: parents for sid, parents in Shard.objects.filter(version__stream__name=stream)
            .values_list("shard_id", "parents")}


def test_i26_1_coordinator_documents_derive_the_stored_shards_and_the_vectors(api: APIClient):
    """Golden: a stream of 3 shards resharded to 7 (the vectors' first two versions): the
    metadata and routing documents carry the vectors' version entries, and what a member derives
    from them is every shard the coordinator stores, with its parents and keys."""
    fx = make_group(stream="orders", group="g1", shards=3)
    start_reshard("orders", 7, actor="test")
    stream = Stream.objects.get(name="orders")
    group = Group.objects.get(name="g1")
    routing, metadata = routing_document(stream), group_metadata(group)
    assert metadata["versions"] == routing["versions"]
    cases = VECTORS["versions"][:2]
    for entry, case in zip(routing["versions"], cases, strict=True):
        expected = dict(case["version"], state="ACTIVE", keyPrefix=stream.key_prefix)  # v1 not sealed yet
        assert entry == expected
    rows = stored("orders")
    derived: dict[str, list[str]] = {}
    for version, case in zip(document_versions(metadata), cases, strict=True):
        for shard in case["shards"]:
            keys = version.keys(shard["index"])
            assert keys.shard_id == shard["shardId"]
            # The vectors use prefix "rsc"; the test installation's prefix is its own.
            assert keys.stream == shard["redisKey"].replace("rsc:", f"{stream.key_prefix}:", 1)
            assert keys.sealed == fx.keys(shard["shardId"]).sealed
            derived[keys.shard_id] = version.parents(shard["index"])
            assert derived[keys.shard_id] == shard["parents"]
    assert derived == rows


@override_settings(MAX_SHARDS_PER_STREAM=16_384)
def test_i26_1_join_answer_is_a_few_hundred_bytes_at_16384_shards(api: APIClient):
    """§3: the answer's size does not grow with the shard count (the first form was ~2 MB)."""
    sizes = {}
    for shards in (4, 16_384):
        fx = make_group(stream=f"s{shards}", group=f"g{shards}", shards=shards)
        r = api.post(fx.url(), {"memberId": "m1", "memberEpoch": 0, "ownedShards": []}, format="json",
                     HTTP_AUTHORIZATION=f"Bearer {fx.key}")
        assert r.status_code == 200
        body = r.json()
        (version,) = document_versions(body["metadata"])
        assert isinstance(version, ShardVersion)
        assert version.shard_count == shards
        # Without the assignment's list of shard ids, which does grow (one member holds all).
        body["assignment"] = {}
        sizes[shards] = len(json.dumps(body, separators=(",", ":")))
    for shards in sizes:  # the 16,384 shard streams would slow every later cleanup's SCAN
        delete_stream_keys(f"s{shards}")
    assert sizes[16_384] - sizes[4] <= 32  # only the digits of the counts and of the names differ
    assert sizes[16_384] <= 1024


def test_i26_1_sync_metadata_answer_carries_the_compact_form(hb: Hb):
    status, body = hb({"memberId": "m1", "memberEpoch": 0, "ownedShards": []})
    assert status == 200
    assert set(body["metadata"]["versions"][0]) == {
        "stream", "version", "state", "shardCount", "parentVersion", "parentShardCount", "keyPrefix"}
