"""The Consumer driver end to end: heartbeats against a local stub, messages on real Redis."""

from __future__ import annotations

import threading

from dataplane import Consumer, Message, Producer
from dataplane.routing import ShardKeys

from .conftest import routing_doc, version_doc, wait_until


def metadata(prefix: str) -> dict:
    return {
        "metadataEpoch": 1,
        "group": "g",
        "stream": "orders",
        "heartbeatIntervalMs": 100,
        "sessionTimeoutMs": 30000,
        "rebalanceTimeoutMs": 60000,
        "startPosition": "earliest",
        "keyPrefix": prefix,
        "versions": [version_doc("orders", 1, 2, prefix)],
    }


def test_consumer_joins_consumes_and_leaves(r, prefix, coordinator, redis_url) -> None:
    coordinator.metadata = metadata(prefix)
    coordinator.routing = routing_doc("orders", prefix, *metadata(prefix)["versions"], write=1)
    got: list[Message] = []
    c = Consumer(
        coordinator.url,
        "g",
        "key-1",
        got.append,
        redis_url=redis_url,
        member_id="member-a",
        block_ms=100,
    )
    t = threading.Thread(target=c.run)
    t.start()
    try:
        with Producer(coordinator.url, "orders", "key-1", redis_url=redis_url) as p:
            p.send_many([(f"k{i}", {"n": str(i)}) for i in range(100)])
        wait_until(lambda: len(got) >= 100, what="consumed")
        wait_until(
            lambda: any(q["memberEpoch"] == 1 and q["ownedShards"] for q in coordinator.requests),
            what="a regular heartbeat",
        )
    finally:
        c.stop()
        t.join(15)
    assert not t.is_alive()
    reqs = coordinator.requests
    assert reqs[0]["memberEpoch"] == 0 and reqs[0]["ownedShards"] == []
    assert reqs[0]["memberId"] == "member-a"
    assert reqs[-1]["memberEpoch"] == -1
    assert set(q["memberId"] for q in reqs) == {"member-a"}
    owned = next(q["ownedShards"] for q in reqs if q["memberEpoch"] == 1)
    assert owned == ["orders:1:0", "orders:1:1"]
    assert "Bearer key-1" in coordinator.auth
    for i in range(2):
        keys = ShardKeys(f"orders:1:{i}", prefix)
        assert r.get(keys.fence("g")) == "1:member-a"
        assert r.xpending(keys.stream, "g")["pending"] == 0


def test_consumer_fenced_aborts_and_rejoins(r, prefix, coordinator, redis_url) -> None:
    coordinator.metadata = metadata(prefix)
    state = {"fenced": False}
    base = coordinator.default_heartbeat

    def heartbeat(req: dict):
        if req["memberEpoch"] > 0 and not state["fenced"]:
            state["fenced"] = True
            return 409, {
                "errorCode": "FENCED_MEMBER_EPOCH",
                "errorMessage": "stale",
                "memberId": req["memberId"],
            }
        return base(req)

    coordinator.heartbeat = heartbeat
    c = Consumer(
        coordinator.url,
        "g",
        "k",
        lambda m: None,
        redis_url=redis_url,
        member_id="member-b",
        block_ms=100,
    )
    t = threading.Thread(target=c.run)
    t.start()
    try:
        wait_until(
            lambda: sum(q["memberEpoch"] == 0 for q in coordinator.requests) >= 2, what="rejoin"
        )
        wait_until(lambda: sorted(c.machine.readable) == ["orders:1:0", "orders:1:1"])
    finally:
        c.stop()
        t.join(15)
    joins = [q for q in coordinator.requests if q["memberEpoch"] == 0]
    assert all(q["ownedShards"] == [] and q["memberId"] == "member-b" for q in joins)
    # Regranted at the higher epoch of the rejoin: the token moved up with it.
    assert r.get(ShardKeys("orders:1:0", prefix).fence("g")) == "2:member-b"
