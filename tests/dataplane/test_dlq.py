"""``dataplane.dlq.DeadLetters`` against real Redis and the stub coordinator: where it finds DLQ
streams, what it lists, and that replay/purge only touch the entries present when they start.
(End to end with a real member and the real coordinator: tests/e2e/test_dlq_tools.py.)"""

from __future__ import annotations

import pytest

from dataplane.dlq import DeadLetters
from dataplane.preflight import PreflightError
from dataplane.routing import ShardKeys, hash64, shard_index

from .conftest import routing_doc, version_doc

GROUP = "g"


@pytest.fixture
def stream(coordinator, prefix):
    """Stream ``orders``: version 1 (2 shards) retired, version 2 (4 shards) live."""
    v2 = version_doc("orders", 2, 4, prefix)
    coordinator.routing = routing_doc("orders", prefix, v2, write=2)
    coordinator.metadata = {"group": GROUP, "stream": "orders", "versions": [v2]}
    return "orders"


def dead_letter(r, prefix: str, shard: str, key: str, n: int = 0, group: str = GROUP) -> str:
    """A DLQ entry as the runtime writes it (``Runtime._to_dlq``)."""
    return r.xadd(
        ShardKeys(shard, prefix).dlq(group),
        {
            "dlq:error": f"ValueError: bad {key}",
            "dlq:deliveries": "5",
            "dlq:id": f"{1000 + n}-0",
            "dlq:shard": shard,
            "dlq:group": group,
            "key": key,
            "n": str(n),
        },
    )


def open_dlq(coordinator, redis_url: str, **kw) -> DeadLetters:
    return DeadLetters(coordinator.url, GROUP, "k", redis_url, **kw)


def test_dlq_found_on_live_and_retired_versions_but_not_on_a_stream_sharing_the_prefix(
    r, prefix, coordinator, redis_url, stream
) -> None:
    dead_letter(r, prefix, "orders:1:1", "a", 1)  # retired version: only SCAN finds it
    dead_letter(r, prefix, "orders:2:3", "b", 2)
    dead_letter(r, prefix, "orders:2:0", "c", 3)
    dead_letter(r, prefix, "orders:x:1:0", "other-stream")  # stream "orders:x"
    dead_letter(r, prefix, "orders:2:0", "other-group", group="g2")
    with open_dlq(coordinator, redis_url) as dl:
        assert dl.shards() == ["orders:1:1", "orders:2:0", "orders:2:3"]
        assert dl.counts() == {"orders:1:1": 1, "orders:2:0": 1, "orders:2:3": 1}
        letters = dl.list()
        assert [(x.shard, x.key, x.source_id, x.deliveries) for x in letters] == [
            ("orders:1:1", "a", "1001-0", 5),
            ("orders:2:0", "c", "1003-0", 5),
            ("orders:2:3", "b", "1002-0", 5),
        ]
        assert letters[0].error == "ValueError: bad a"
        assert letters[0].fields == {"key": "a", "n": "1"}
        assert [x.key for x in dl.list(limit=2)] == ["a", "c"]
        assert [x.key for x in dl.list(shard="orders:2:3")] == ["b"]
        with pytest.raises(PreflightError, match="not a shard of stream 'orders'"):
            dl.list(shard="orders:x:1:0")


def test_dlq_replay_routes_by_key_on_the_write_version_and_deletes_after_the_append(
    r, prefix, coordinator, redis_url, stream
) -> None:
    for n, key in enumerate(["u1", "u2", "u3", "u1"]):
        dead_letter(r, prefix, "orders:1:0", key, n)
    keyless = r.xadd(
        ShardKeys("orders:1:1", prefix).dlq(GROUP),
        {"dlq:error": "E", "dlq:deliveries": "5", "dlq:id": "7-0", "dlq:shard": "orders:1:1",
         "dlq:group": GROUP, "x": "1"},
    )
    with open_dlq(coordinator, redis_url, page_size=2) as dl:
        done = dl.replay()
        assert dl.list() == []
        assert dl.counts() == {}
    assert len(done) == 5
    for letter, sent in done:
        assert sent.shard == f"orders:2:{shard_index(hash64(letter.key), 4)}"
        entry = r.xrange(ShardKeys(sent.shard, prefix).stream, sent.id, sent.id)[0][1]
        assert entry == {"key": letter.key, **letter.fields, "dlq:replay-for": GROUP}
    # Per key, the replay keeps the DLQ's order; a keyless letter is routed by its source id
    # (the key the runtime gave it).
    u1 = [sent for letter, sent in done if letter.key == "u1"]
    assert u1[0].shard == u1[1].shard
    assert u1[0].id < u1[1].id
    # DLQ ids are per stream: two DLQs can hold the same id, so match the shard too.
    keyless_letters = [ltr.key for ltr, _ in done if (ltr.shard, ltr.id) == ("orders:1:1", keyless)]
    assert keyless_letters == ["7-0"]


def test_dlq_replay_and_purge_stop_at_the_entries_present_when_they_started(
    r, prefix, coordinator, redis_url, stream
) -> None:
    shard = "orders:2:0"
    for n in range(3):
        dead_letter(r, prefix, shard, f"k{n}", n)
    with open_dlq(coordinator, redis_url, page_size=1) as dl:
        xdel = dl.client.xdel

        def xdel_then_fail_again(key: str, *ids: str) -> int:
            # The replayed message fails again at once and is dead-lettered anew meanwhile.
            n = xdel(key, *ids)
            dead_letter(r, prefix, shard, "again", 9)
            return n

        dl.client.xdel = xdel_then_fail_again
        assert [letter.key for letter, _ in dl.replay()] == ["k0", "k1", "k2"]
        dl.client.xdel = xdel
        assert [x.key for x in dl.list()] == ["again"] * 3
        dead_letter(r, prefix, shard, "later", 10)
        assert dl.purge(limit=3) == 3
        assert [x.key for x in dl.list()] == ["later"]
        assert dl.purge() == 1
        assert dl.list() == []


def test_dlq_refused_key_or_unknown_group_is_a_preflight_error(coordinator, redis_url) -> None:
    with pytest.raises(PreflightError, match="HTTP 404") as info:
        open_dlq(coordinator, redis_url)  # the stub knows no group: 404
    assert info.value.exit_code == 2
