"""``async def`` handlers on the runtime's event loop: the sync tests' guarantees, mirrored."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict

from dataplane.message import Message
from dataplane.routing import ShardKeys

from .conftest import make_grant, pending, wait_until


def test_async_per_key_order_with_concurrent_coroutines(r, prefix, start_runtime) -> None:
    shards = [f"s:1:{i}" for i in range(2)]
    keys = [f"k{i}" for i in range(20)]
    expected: dict[str, list[int]] = defaultdict(list)
    pipe = r.pipeline(transaction=False)
    for seq in range(30):
        for i, k in enumerate(keys):
            pipe.xadd(ShardKeys(shards[i % 2], prefix).stream, {"key": k, "seq": str(seq)})
            expected[k].append(seq)
    pipe.execute()
    seen: dict[str, list[int]] = defaultdict(list)
    running = {"now": 0, "max": 0}
    loops: set[int] = set()

    async def handler(msg: Message) -> None:
        running["now"] += 1  # one event loop thread: no lock needed
        running["max"] = max(running["max"], running["now"])
        loops.add(id(asyncio.get_running_loop()))
        await asyncio.sleep(0)  # let other coroutines interleave
        seen[msg.key].append(int(msg.fields["seq"]))
        running["now"] -= 1

    rt = start_runtime(handler, max_concurrency=8, batch_size=50)
    for shard in shards:
        rt.grant(make_grant(prefix, shard))
    total = sum(map(len, expected.values()))
    wait_until(lambda: sum(map(len, seen.values())) >= total, what="all handled")
    assert dict(seen) == dict(expected)
    assert 1 < running["max"] <= 8  # coroutines really overlapped, within the bound
    assert len(loops) == 1
    wait_until(
        lambda: all(pending(r, ShardKeys(s, prefix).stream) == 0 for s in shards),
        what="acks flushed",
    )


def test_async_max_concurrency_bounds_coroutines_in_flight(r, prefix, start_runtime) -> None:
    shard = "s:1:0"
    keys = ShardKeys(shard, prefix)
    release = threading.Event()
    running = {"now": 0, "max": 0}

    async def handler(msg: Message) -> None:
        running["now"] += 1
        running["max"] = max(running["max"], running["now"])
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)
        running["now"] -= 1

    rt = start_runtime(handler, max_concurrency=3)
    rt.grant(make_grant(prefix, shard))
    wait_until(lambda: rt.status(shard) == "ACTIVE")
    for i in range(30):
        r.xadd(keys.stream, {"key": f"k{i}"})
    try:
        wait_until(lambda: running["now"] == 3, what="three coroutines running")
        wait_until(lambda: rt.in_flight(shard) == 30, what="all read, 27 waiting for a lane")
        assert running["now"] == 3
    finally:
        release.set()
    wait_until(lambda: pending(r, keys.stream) == 0, what="all acked")
    assert running["max"] == 3


def test_async_retry_then_dlq_after_max_deliveries(r, prefix, start_runtime) -> None:
    shard = "s:1:0"
    keys = ShardKeys(shard, prefix)
    calls: dict[str, int] = defaultdict(int)
    ok: list[str] = []

    async def handler(msg: Message) -> None:
        calls[msg.fields["n"]] += 1
        await asyncio.sleep(0)
        if msg.key == "bad":
            raise ValueError(f"boom {msg.delivery_count}")
        ok.append(msg.fields["n"])

    rt = start_runtime(handler, max_concurrency=2, max_deliveries=3)
    rt.grant(make_grant(prefix, shard))
    wait_until(lambda: rt.status(shard) == "ACTIVE")
    r.xadd(keys.stream, {"key": "good", "n": "1"})
    bad_id = r.xadd(keys.stream, {"key": "bad", "n": "2", "payload": "x"})
    r.xadd(keys.stream, {"key": "good", "n": "3"})
    wait_until(lambda: r.xlen(keys.dlq("g")) == 1 and len(ok) == 2, what="DLQ entry")
    wait_until(lambda: pending(r, keys.stream) == 0, what="all acked")
    assert calls["2"] == 3
    assert ok == ["1", "3"]
    [(_id, dlq_fields)] = r.xrange(keys.dlq("g"))
    assert dlq_fields["dlq:deliveries"] == "3"
    assert dlq_fields["dlq:error"] == "ValueError: boom 3"
    assert dlq_fields["dlq:id"] == bad_id
    assert dlq_fields["payload"] == "x"
    rt.revoke(shard)
    wait_until(lambda: rt.in_flight(shard) == 0, what="in-flight back to 0")


def test_async_revocation_waits_for_in_flight_coroutine(r, prefix, start_runtime) -> None:
    shard = "s:1:0"
    keys = ShardKeys(shard, prefix)
    entered = threading.Event()
    release = threading.Event()
    handled: list[str] = []

    async def handler(msg: Message) -> None:
        entered.set()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)
        handled.append(msg.id)

    rt = start_runtime(handler, max_concurrency=1, batch_size=10)
    rt.grant(make_grant(prefix, shard))
    wait_until(lambda: rt.status(shard) == "ACTIVE")
    ids = [r.xadd(keys.stream, {"key": "same"}) for _ in range(5)]
    assert entered.wait(10)
    # Redis counts a read as pending before the runtime has dispatched it: wait for both.
    wait_until(lambda: pending(r, keys.stream) == 5 and rt.in_flight(shard) == 5,
               what="all five read and dispatched, one in progress")
    rt.revoke(shard)
    assert rt.in_flight(shard) >= 5  # the coroutine in progress holds the revocation
    release.set()
    wait_until(lambda: rt.in_flight(shard) == 0, what="revocation done")
    assert handled == ids[:1]  # the coroutine in progress finished and was ACKed
    assert pending(r, keys.stream) == 4  # the rest waits for the next owner


def test_async_ack_before_mode_acks_then_runs(r, prefix, start_runtime) -> None:
    shard = "s:1:0"
    keys = ShardKeys(shard, prefix)
    seen_pending: list[int] = []

    async def handler(msg: Message) -> None:
        seen_pending.append(pending(r, keys.stream))

    rt = start_runtime(handler, ack="before")
    rt.grant(make_grant(prefix, shard))
    wait_until(lambda: rt.status(shard) == "ACTIVE")
    r.xadd(keys.stream, {"key": "a"})
    wait_until(lambda: len(seen_pending) == 1)
    assert seen_pending == [0]
