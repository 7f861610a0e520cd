"""Issue 25.2: batch handlers (a list of one shard's messages, ID order, up to batch_size),
per-key order, ACKs, whole-batch and item-by-item retries and dead letters, on real Redis."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest

from dataplane import BatchItemsFailed, Message
from dataplane.routing import ShardKeys
from dataplane.runtime import Runtime, RuntimeConfig
from tests import spawn

from .conftest import make_grant, pending, wait_until


@pytest.fixture
def start_batch(redis_url: str, runtimes: list):
    def _start(handler, **cfg) -> Runtime:
        cfg.setdefault("block_ms", 200)
        cfg.setdefault("retry_backoff_ms", 1)
        rt = Runtime(redis_url, "g", "m-1", handler, RuntimeConfig(**cfg), batch=True)
        rt.start()
        runtimes.append(rt)
        return rt

    return _start


def id_key(msg_id: str) -> tuple[int, int]:
    ms, seq = msg_id.split("-")
    return int(ms), int(seq)


def test_i25_2_batches_are_one_shards_messages_in_id_order_up_to_batch_size(
    r, prefix, start_batch
) -> None:
    shards = ["orders:1:0", "orders:1:1"]
    for shard in shards:
        stream = ShardKeys(shard, prefix).stream
        for i in range(60):
            r.xadd(stream, {"key": f"k{i % 7}", "n": str(i)})
    calls: list[list[Message]] = []
    lock = threading.Lock()

    def handler(msgs: list[Message]) -> None:
        with lock:
            calls.append(list(msgs))

    rt = start_batch(handler, batch_size=10, workers=3)
    for shard in shards:
        rt.grant(make_grant(prefix, shard))
    wait_until(lambda: sum(len(c) for c in calls) == 120, what="all handled")
    for shard in shards:
        wait_until(lambda s=shard: pending(r, ShardKeys(s, prefix).stream) == 0, what="ACKed")
    per_key: dict[tuple[str, str], list[int]] = defaultdict(list)
    for call in calls:
        assert 1 <= len(call) <= 10
        assert len({m.shard for m in call}) == 1
        ids = [id_key(m.id) for m in call]
        assert ids == sorted(ids)
        for m in call:
            per_key[(m.shard, m.key)].append(int(m.fields["n"]))
    assert all(ns == sorted(ns) for ns in per_key.values())  # per-key order
    assert sum(len(ns) for ns in per_key.values()) == 120  # each once


def test_i25_2_a_raise_retries_the_whole_batch_then_dead_letters_it(
    r, prefix, start_batch
) -> None:
    keys = ShardKeys("orders:1:0", prefix)
    for i in range(5):
        r.xadd(keys.stream, {"key": f"k{i}", "n": str(i)})
    deliveries: list[list[int]] = []

    def handler(msgs: list[Message]) -> None:
        deliveries.append([m.delivery_count for m in msgs])
        raise ValueError("sink down")

    rt = start_batch(handler, batch_size=10, workers=1, max_deliveries=3)
    rt.grant(make_grant(prefix, "orders:1:0"))
    wait_until(lambda: r.xlen(keys.dlq("g")) == 5, what="the batch dead-lettered")
    wait_until(lambda: pending(r, keys.stream) == 0, what="ACKed by the DLQ move")
    assert deliveries == [[1] * 5, [2] * 5, [3] * 5]
    entry = r.xrange(keys.dlq("g"))[0][1]
    assert entry["dlq:error"] == "ValueError: sink down"
    assert entry["dlq:deliveries"] == "3"


def test_i25_2_a_batch_that_fails_once_is_retried_whole_and_then_acked(
    r, prefix, start_batch
) -> None:
    keys = ShardKeys("orders:1:0", prefix)
    for i in range(4):
        r.xadd(keys.stream, {"key": "same", "n": str(i)})
    seen: list[list[str]] = []

    def handler(msgs: list[Message]) -> None:
        seen.append([m.fields["n"] for m in msgs])
        if len(seen) == 1:
            raise ValueError("once")

    rt = start_batch(handler, batch_size=10, workers=1)
    rt.grant(make_grant(prefix, "orders:1:0"))
    wait_until(lambda: len(seen) == 2 and pending(r, keys.stream) == 0, what="retried, ACKed")
    assert seen == [["0", "1", "2", "3"], ["0", "1", "2", "3"]]
    assert r.xlen(keys.dlq("g")) == 0


def test_i25_2_batch_items_failed_retries_and_dead_letters_only_those(
    r, prefix, start_batch
) -> None:
    keys = ShardKeys("orders:1:0", prefix)
    ids = [r.xadd(keys.stream, {"key": f"k{i}", "n": str(i)}) for i in range(5)]
    bad = ids[2]
    calls: list[list[str]] = []

    def handler(msgs: list[Message]) -> None:
        calls.append([m.id for m in msgs])
        if any(m.id == bad for m in msgs):
            raise BatchItemsFailed({bad: ValueError("bad row")})

    rt = start_batch(handler, batch_size=10, workers=1, max_deliveries=2)
    rt.grant(make_grant(prefix, "orders:1:0"))
    wait_until(lambda: r.xlen(keys.dlq("g")) == 1, what="the failed item dead-lettered")
    wait_until(lambda: pending(r, keys.stream) == 0, what="the rest ACKed")
    assert calls == [ids, [bad]]  # only the failed one ran again
    entry = r.xrange(keys.dlq("g"))[0][1]
    assert entry["dlq:id"] == bad
    assert entry["dlq:error"] == "ValueError: bad row"


def test_i25_2_async_batch_handler(r, prefix, start_batch) -> None:
    keys = ShardKeys("orders:1:0", prefix)
    ids = [r.xadd(keys.stream, {"key": f"k{i % 2}", "n": str(i)}) for i in range(6)]
    calls: list[list[str]] = []

    async def handler(msgs: list[Message]) -> None:
        calls.append([m.id for m in msgs])
        if len(calls) == 1:
            raise BatchItemsFailed([msgs[0].id])

    rt = start_batch(handler, batch_size=10, max_concurrency=1)
    rt.grant(make_grant(prefix, "orders:1:0"))
    wait_until(lambda: len(calls) == 2 and pending(r, keys.stream) == 0, what="handled")
    # The first call's other five counted as handled; only the failed one ran again.
    assert calls == [ids, [ids[0]]]
    assert r.xlen(keys.dlq("g")) == 0


def test_i25_2_consumer_takes_a_batch_handler(r, prefix, coordinator, redis_url) -> None:
    from dataplane import Consumer

    from .conftest import version_doc

    coordinator.metadata = {
        "metadataEpoch": 1, "group": "g", "stream": "orders", "heartbeatIntervalMs": 100,
        "sessionTimeoutMs": 30000, "startPosition": "earliest", "keyPrefix": prefix,
        "versions": [version_doc("orders", 1, 2, prefix)],
    }  # fmt: skip
    for i in range(30):
        r.xadd(ShardKeys(f"orders:1:{i % 2}", prefix).stream, {"key": f"k{i}"})
    got: list[Message] = []
    with pytest.raises(ValueError, match="exactly one of handler and batch_handler"):
        Consumer(coordinator.url, "g", "k", got.append, batch_handler=got.extend)
    with pytest.raises(ValueError, match="exactly one of handler and batch_handler"):
        Consumer(coordinator.url, "g", "k", None)
    c = Consumer(coordinator.url, "g", "k", None, batch_handler=got.extend,
                 redis_url=redis_url, block_ms=100)  # fmt: skip
    t = threading.Thread(target=c.run)
    t.start()
    try:
        wait_until(lambda: len(got) == 30, what="all 30 through the batch handler")
    finally:
        c.stop()
        t.join(15)
    assert not t.is_alive()
    for i in range(2):
        assert pending(r, ShardKeys(f"orders:1:{i}", prefix).stream) == 0


def test_i25_2_cli_consume_with_batch_handler(r, prefix, coordinator, redis_url, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from .conftest import ROOT, version_doc

    coordinator.metadata = {
        "metadataEpoch": 1, "group": "g", "stream": "orders", "heartbeatIntervalMs": 100,
        "sessionTimeoutMs": 30000, "startPosition": "earliest", "keyPrefix": prefix,
        "versions": [version_doc("orders", 1, 2, prefix)],
    }  # fmt: skip
    for i in range(10):
        r.xadd(ShardKeys(f"orders:1:{i % 2}", prefix).stream, {"key": f"k{i}"})
    seen = tmp_path / "seen.txt"
    (tmp_path / "bh.py").write_text(
        f"def handle(msgs):\n    open({str(seen)!r}, 'a').write(f'{{len(msgs)}}\\n')\n"
    )
    proc = spawn.Popen(
        [sys.executable, "-m", "dataplane", "consume", "--coordinator", coordinator.url,
         "--group", "g", "--api-key", "k", "--redis", redis_url, "--batch-handler",
         "bh:handle", "--block-ms", "100"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: seen.exists() and sum(map(int, seen.read_text().split())) == 10,
                   timeout=30, what="10 messages in batches")  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
