"""Issue 25.1: rebalance listeners on_assigned / on_revoked / on_lost, against a scripted
coordinator stub and the real Redis."""

from __future__ import annotations

import logging
import threading
from typing import Any

from dataplane import Consumer, Message
from dataplane.routing import ShardKeys

from ..consumer_thread import run_consumer
from .conftest import FakeCoordinator, version_doc, wait_until

SHARDS = ["orders:1:0", "orders:1:1"]


def metadata(prefix: str, session_ms: int = 30000) -> dict:
    return {
        "metadataEpoch": 1,
        "group": "g",
        "stream": "orders",
        "heartbeatIntervalMs": 100,
        "sessionTimeoutMs": session_ms,
        "startPosition": "earliest",
        "keyPrefix": prefix,
        "versions": [version_doc("orders", 1, 2, prefix)],
    }


class Script:
    """A coordinator that grants ``assigned`` on OK answers; ``refuse`` answers every regular
    heartbeat with that (status, body)."""

    def __init__(self, coordinator: FakeCoordinator) -> None:
        self.c = coordinator
        self.assigned = list(SHARDS)
        self.refuse: tuple[int, dict] | None = None
        self.fence_once = False
        coordinator.heartbeat = self.heartbeat

    def heartbeat(self, req: dict) -> tuple[int, dict]:
        c = self.c
        if req["memberEpoch"] < 0:
            return 200, c.response(req, req["memberEpoch"], [], {"metadataEpoch": 1})
        if req["memberEpoch"] > 0 and self.fence_once:
            self.fence_once = False
            return 409, {"errorCode": "FENCED_MEMBER_EPOCH", "errorMessage": "stale"}
        if req["memberEpoch"] > 0 and self.refuse is not None:
            return self.refuse
        if req["memberEpoch"] == 0:
            c.epoch += 1
        md = c.metadata if req["memberEpoch"] == 0 else {"metadataEpoch": 1}
        return 200, c.response(req, c.epoch, list(self.assigned), md)


class Events:
    """What the listeners and the handler saw, in order."""

    def __init__(self, coordinator: FakeCoordinator) -> None:
        self.c = coordinator
        self.log: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        self.requests_at_revoke: list[dict] = []

    def add(self, kind: str, what: Any) -> None:
        with self.lock:
            self.log.append((kind, what))

    def on_assigned(self, shards: list[str]) -> None:
        self.add("assigned", shards)

    def on_revoked(self, shards: list[str]) -> None:
        if not self.of("revoked"):  # the first revocation (the shutdown revokes the rest)
            self.requests_at_revoke = list(self.c.requests)
        self.add("revoked", shards)

    def on_lost(self, shards: list[str]) -> None:
        self.add("lost", shards)

    def of(self, kind: str) -> list[Any]:
        with self.lock:
            return [w for k, w in self.log if k == kind]

    def kinds(self) -> list[str]:
        with self.lock:
            return [k for k, _ in self.log]


def start(coordinator, redis_url: str, events: Events, handler=None, **kw: Any):
    c = Consumer(
        coordinator.url, "g", "k", handler or (lambda m: None), redis_url=redis_url,
        member_id=kw.pop("member_id", "member-l"), block_ms=100,
        on_assigned=kw.pop("on_assigned", events.on_assigned),
        on_revoked=kw.pop("on_revoked", events.on_revoked),
        on_lost=kw.pop("on_lost", events.on_lost), **kw,
    )  # fmt: skip
    running = run_consumer(c, daemon=False)
    return c, running.thread, running.raised


def stop(c: Consumer, t: threading.Thread) -> None:
    c.stop()
    t.join(15)
    assert not t.is_alive()


def revoked_reported(requests: list[dict], shard: str) -> bool:
    return any(
        e["shard"] == shard and e["state"] == "REVOKED"
        for q in requests
        for e in q.get("revokingShards") or []
    )


def test_i25_1_grant_calls_on_assigned_before_the_shards_are_read(
    r, prefix, coordinator, redis_url
) -> None:
    coordinator.metadata = metadata(prefix)
    Script(coordinator)
    for shard in SHARDS:
        r.xadd(ShardKeys(shard, prefix).stream, {"key": shard, "n": "1"})
    events = Events(coordinator)
    c, t, _ = start(coordinator, redis_url, events, lambda m: events.add("msg", m.shard))
    try:
        wait_until(lambda: len(events.of("msg")) == 2, what="both messages handled")
    finally:
        stop(c, t)
    assert events.of("assigned") == [SHARDS]
    assert events.kinds()[0] == "assigned"
    # The clean shutdown hands them over (each once, as its in-flight work ends).
    assert sorted(s for shards in events.of("revoked") for s in shards) == SHARDS
    assert events.of("lost") == []


def test_i25_1_cooperative_revocation_calls_on_revoked_after_in_flight_and_before_revoked(
    r, prefix, coordinator, redis_url
) -> None:
    coordinator.metadata = metadata(prefix)
    script = Script(coordinator)
    release = threading.Event()
    events = Events(coordinator)

    def handler(m: Message) -> None:
        if m.shard == "orders:1:1":
            events.add("msg-start", m.shard)
            release.wait(10)
            events.add("msg-done", m.shard)

    r.xadd(ShardKeys("orders:1:1", prefix).stream, {"key": "a", "n": "1"})
    c, t, _ = start(coordinator, redis_url, events, handler)
    try:
        wait_until(lambda: events.of("msg-start"), what="the slow message in flight")
        script.assigned = ["orders:1:0"]
        wait_until(lambda: "orders:1:1" in c.machine.revoking, what="revocation started")
        n = len(coordinator.requests)
        wait_until(lambda: len(coordinator.requests) > n + 2, what="heartbeats meanwhile")
        assert events.of("revoked") == []  # the message is still in flight
        release.set()
        wait_until(lambda: events.of("revoked"), what="on_revoked")
        wait_until(lambda: revoked_reported(coordinator.requests, "orders:1:1"), what="REVOKED")
    finally:
        release.set()
        stop(c, t)
    assert events.of("revoked")[0] == ["orders:1:1"]
    kinds = events.kinds()
    assert kinds.index("msg-done") < kinds.index("revoked")
    assert not revoked_reported(events.requests_at_revoke, "orders:1:1")
    # The message was ACKed before the hand-over.
    assert r.xpending(ShardKeys("orders:1:1", prefix).stream, "g")["pending"] == 0
    assert events.of("lost") == []


def test_i25_1_fence_calls_on_lost_not_on_revoked_and_the_rejoin_assigns_again(
    prefix, coordinator, redis_url
) -> None:
    coordinator.metadata = metadata(prefix)
    script = Script(coordinator)
    events = Events(coordinator)
    c, t, _ = start(coordinator, redis_url, events)
    try:
        wait_until(lambda: events.of("assigned"), what="assigned")
        script.fence_once = True
        wait_until(lambda: len(events.of("assigned")) == 2, what="assigned after the rejoin")
        lost_before_stop = events.of("lost")
        revoked_before_stop = events.of("revoked")
    finally:
        stop(c, t)
    assert lost_before_stop == [SHARDS]
    assert revoked_before_stop == []
    kinds = events.kinds()
    assert kinds[:3] == ["assigned", "lost", "assigned"]


def test_i25_1_session_expiry_calls_on_lost(prefix, coordinator, redis_url) -> None:
    coordinator.metadata = metadata(prefix, session_ms=600)
    script = Script(coordinator)
    events = Events(coordinator)
    c, t, _ = start(coordinator, redis_url, events)
    try:
        wait_until(lambda: events.of("assigned"), what="assigned")
        script.refuse = (400, {"errorCode": "INVALID_REQUEST", "errorMessage": "no"})
        wait_until(lambda: events.of("lost"), what="on_lost after the session timeout")
        script.refuse = None
    finally:
        stop(c, t)
    assert events.of("lost")[0] == SHARDS
    assert events.kinds()[:2] == ["assigned", "lost"]


def test_i25_1_reshard_drain_then_revocation_calls_on_revoked(
    r, prefix, coordinator, redis_url
) -> None:
    coordinator.metadata = metadata(prefix)
    script = Script(coordinator)
    events = Events(coordinator)
    sealed = ShardKeys("orders:1:0", prefix)
    c, t, _ = start(coordinator, redis_url, events)
    try:
        wait_until(lambda: events.of("assigned"), what="assigned")
        r.set(sealed.sealed, "1")
        wait_until(
            lambda: any("orders:1:0" in q.get("drainedShards", []) for q in coordinator.requests),
            what="drained reported",
        )
        script.assigned = ["orders:1:1"]  # the coordinator takes the drained parent away
        wait_until(lambda: revoked_reported(coordinator.requests, "orders:1:0"), what="REVOKED")
        revoked = events.of("revoked")
    finally:
        stop(c, t)
    assert revoked[0] == ["orders:1:0"]
    assert not revoked_reported(events.requests_at_revoke, "orders:1:0")
    assert events.of("lost") == []


def test_i25_1_static_temporary_leave_calls_on_revoked_before_the_leave(
    prefix, coordinator, redis_url
) -> None:
    coordinator.metadata = metadata(prefix)
    Script(coordinator)
    events = Events(coordinator)
    c, t, _ = start(coordinator, redis_url, events, instance_id="billing-1")
    wait_until(lambda: events.of("assigned"), what="assigned")
    stop(c, t)
    assert sorted(s for shards in events.of("revoked") for s in shards) == SHARDS
    assert events.of("lost") == []
    assert coordinator.requests[-1]["memberEpoch"] == -2
    assert all(q["memberEpoch"] != -2 for q in events.requests_at_revoke)


def test_i25_1_a_raising_listener_is_logged_and_the_protocol_goes_on(
    r, prefix, coordinator, redis_url, caplog
) -> None:
    coordinator.metadata = metadata(prefix)
    script = Script(coordinator)
    events = Events(coordinator)

    def boom(shards: list[str]) -> None:
        events.add("boom", shards)
        raise RuntimeError("listener bug")

    r.xadd(ShardKeys("orders:1:0", prefix).stream, {"key": "a", "n": "1"})
    caplog.set_level(logging.ERROR, logger="dataplane")
    c, t, raised = start(coordinator, redis_url, events, lambda m: events.add("msg", m.id),
                         on_assigned=boom, on_revoked=boom)  # fmt: skip
    try:
        wait_until(lambda: events.of("msg"), what="the shard read despite on_assigned raising")
        script.assigned = ["orders:1:0"]
        wait_until(lambda: revoked_reported(coordinator.requests, "orders:1:1"), what="REVOKED")
    finally:
        stop(c, t)
    assert raised == []
    assert events.of("boom")[:2] == [SHARDS, ["orders:1:1"]]
    assert any("on_assigned listener raised" in rec.getMessage() for rec in caplog.records)
    assert any("on_revoked listener raised" in rec.getMessage() for rec in caplog.records)


def test_i25_1_async_listeners_run_on_the_async_handlers_loop(
    prefix, coordinator, redis_url
) -> None:
    coordinator.metadata = metadata(prefix)
    Script(coordinator)
    events = Events(coordinator)
    loops: list[Any] = []

    async def handler(m: Message) -> None:
        pass

    async def on_assigned(shards: list[str]) -> None:
        import asyncio

        loops.append(asyncio.get_running_loop())
        events.add("assigned", shards)

    c, t, _ = start(coordinator, redis_url, events, handler, on_assigned=on_assigned)
    try:
        wait_until(lambda: events.of("assigned"), what="async on_assigned")
    finally:
        stop(c, t)
    assert events.of("assigned") == [SHARDS]
    assert loops == [c.runtime.workers.loop]  # type: ignore[attr-defined]
