"""The Consumer driver end to end: heartbeats against a local stub, messages on real Redis."""

from __future__ import annotations

import logging
import threading

import pytest

from dataplane import (
    AuthenticationError,
    ConfigurationError,
    Consumer,
    GroupNotFoundError,
    InstanceIdReplaced,
    Message,
    Producer,
    RedisUnavailableError,
)
from dataplane.protocol import instance_replaced_reason
from dataplane.routing import ShardKeys
from tests.ports import refused_port

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
    assert reqs[0]["memberEpoch"] == 0
    assert reqs[0]["ownedShards"] == []
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


def _run_in_thread(c: Consumer) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            c.run()
        except BaseException as exc:  # surfaced by the test
            raised.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, raised


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (401, {"errorCode": "UNAUTHORIZED", "errorMessage": "bad key"}, AuthenticationError),
        (403, {"errorCode": "FORBIDDEN", "errorMessage": "other group"}, AuthenticationError),
        (404, {"errorCode": "GROUP_ID_NOT_FOUND", "errorMessage": "no g"}, GroupNotFoundError),
    ],
)
def test_refusal_before_the_first_join_is_fatal(coordinator, redis_url, status, body, error):
    coordinator.heartbeat = lambda req: (status, body)
    c = Consumer(coordinator.url, "g", "k", lambda m: None, redis_url=redis_url, block_ms=100)
    t, raised = _run_in_thread(c)
    t.join(15)
    assert not t.is_alive()
    assert len(raised) == 1
    assert isinstance(raised[0], error)
    assert isinstance(raised[0], ConfigurationError)
    assert len(coordinator.requests) == 1  # no retry loop


def test_r1s_replaced_static_consumer_aborts_and_run_raises_instead_of_rejoining(
    r, prefix, coordinator, redis_url
) -> None:
    """§9 R1s: another process joined with our instance id. Kafka's FENCED_INSTANCE_ID is
    fatal; here the marker in UNKNOWN_MEMBER_ID's message is, after a successful start too."""
    coordinator.metadata = metadata(prefix)
    base = coordinator.default_heartbeat
    state = {"replaced": False}

    def heartbeat(req: dict):
        if req["memberEpoch"] > 0 and state["replaced"]:
            message = f"{instance_replaced_reason('billing-3', 'newer')}; stop (§9)"
            return 409, {"errorCode": "UNKNOWN_MEMBER_ID", "errorMessage": message,
                         "memberId": req["memberId"]}  # fmt: skip
        return base(req)

    coordinator.heartbeat = heartbeat
    c = Consumer(coordinator.url, "g", "k", lambda m: None, redis_url=redis_url,
                 member_id="older", instance_id="billing-3", block_ms=100)  # fmt: skip
    t, raised = _run_in_thread(c)
    try:
        wait_until(lambda: len(c.machine.readable) == 2, what="joined, both shards read")
        state["replaced"] = True
        t.join(15)
    finally:
        c.stop()
        t.join(15)
    assert not t.is_alive()
    assert len(raised) == 1, raised
    assert isinstance(raised[0], InstanceIdReplaced), raised
    exc = raised[0]
    assert (exc.instance_id, exc.member_id, exc.by_member_id) == ("billing-3", "older", "newer")
    assert str(exc) == (
        "another process joined with instance id billing-3 (member newer); this one stops"
    )
    assert c.machine.readable == {}
    assert c.machine.left
    # Joined once and never again; no leave either (the coordinator no longer holds it).
    assert [q["memberEpoch"] for q in coordinator.requests].count(0) == 1
    assert all(q["memberEpoch"] > 0 for q in coordinator.requests[1:])


def test_redis_unreachable_at_start_is_fatal(coordinator) -> None:
    with refused_port() as port:
        c = Consumer(coordinator.url, "g", "k", lambda m: None, redis_url=f"redis://127.0.0.1:{port}/0")
        t, raised = _run_in_thread(c)
        t.join(30)
    assert not t.is_alive()
    assert len(raised) == 1
    assert isinstance(raised[0], RedisUnavailableError)
    assert coordinator.requests == []  # nothing joined


def test_refusal_after_a_successful_join_is_retried_with_a_warning(
    r, prefix, coordinator, redis_url, caplog
) -> None:
    coordinator.metadata = metadata(prefix)
    base = coordinator.default_heartbeat
    refusals = {"left": 0}

    def heartbeat(req: dict):
        if req["memberEpoch"] > 0 and refusals["left"] > 0:
            refusals["left"] -= 1
            return 401, {"errorCode": "UNAUTHORIZED", "errorMessage": "key rotated"}
        return base(req)

    coordinator.heartbeat = heartbeat
    c = Consumer(coordinator.url, "g", "k", lambda m: None, redis_url=redis_url, block_ms=100)
    caplog.set_level(logging.WARNING, logger="dataplane")
    t, raised = _run_in_thread(c)
    try:
        wait_until(lambda: c.machine.member_epoch == 1, what="joined")
        refusals["left"] = 2
        wait_until(lambda: refusals["left"] == 0, what="two refusals")
        n = len(coordinator.requests)
        wait_until(lambda: len(coordinator.requests) > n + 1, what="heartbeats again")
        assert c.machine.member_epoch == 1
        assert sorted(c.machine.readable) == [
            "orders:1:0",
            "orders:1:1",
        ]
    finally:
        c.stop()
        t.join(15)
    assert raised == []
    assert any("heartbeat refused: HTTP 401" in rec.getMessage() for rec in caplog.records)


def test_member_logs_grants_revocations_drains_fences_and_rejoins_at_info(
    r, prefix, coordinator, redis_url, caplog
) -> None:
    coordinator.metadata = metadata(prefix)
    base = coordinator.default_heartbeat
    script = {"drop": False, "fence": False}

    def heartbeat(req: dict):
        if req["memberEpoch"] > 0 and script["fence"]:
            script["fence"] = False
            return 409, {"errorCode": "FENCED_MEMBER_EPOCH", "errorMessage": "stale epoch"}
        status, body = base(req)
        if script["drop"] and req["memberEpoch"] > 0:
            body["assignment"]["assignedShards"] = ["orders:1:0"]
        return status, body

    coordinator.heartbeat = heartbeat
    caplog.set_level(logging.INFO, logger="dataplane")
    c = Consumer(coordinator.url, "g", "k", lambda m: None, redis_url=redis_url, block_ms=100)
    t, raised = _run_in_thread(c)
    try:
        wait_until(lambda: c.runtime.status("orders:1:1") == "ACTIVE", what="granted")
        versions = metadata(prefix)["versions"]
        coordinator.routing = routing_doc("orders", prefix, *versions, write=1)
        with Producer(coordinator.url, "orders", "k", redis_url=redis_url) as p:
            p.send_many([(f"k{i}", {"n": str(i)}) for i in range(50)])
        r.set(ShardKeys("orders:1:0", prefix).sealed, "1")
        wait_until(lambda: "orders:1:0" in c.machine.drained, what="drained")
        script["drop"] = True
        wait_until(lambda: "orders:1:1" not in c.machine.readable, what="revoked")
        script["drop"] = False
        script["fence"] = True
        wait_until(lambda: c.machine.member_epoch == 2, what="rejoined")
    finally:
        c.stop()
        t.join(15)
    assert raised == []
    lines = [rec.getMessage() for rec in caplog.records if rec.name.startswith("dataplane")]
    info = [rec for rec in caplog.records if rec.levelno == logging.INFO]
    assert any("member-" not in m and "joined at epoch 1" in m for m in lines)
    assert any("shard orders:1:1 granted at epoch 1" in m for m in lines)
    assert any("shard orders:1:0 drained" in m for m in lines)
    assert any("shard orders:1:1 revoked" in m for m in lines)
    assert any("fenced (FENCED_MEMBER_EPOCH: stale epoch)" in m for m in lines)
    assert any("rejoined at epoch 2" in m for m in lines)
    assert len(info) < 30  # one line per event, nothing per message (50 were handled)
