"""Issue 4, end to end: a reshard (§6) under steady production, against the real coordinator
(gunicorn on PostgreSQL), real Redis and two real member processes. The sweeps (seal, drain
bookkeeping, retire) run from the test process while it polls, as beat would."""

from __future__ import annotations

import pytest

from groups.models import ShardVersion, Stream
from groups.resharding import start_reshard

from .conftest import Ledger, SteadyProducer, World

pytestmark = [
    pytest.mark.needs_postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]

GROUP_CONFIG = {"heartbeat_interval_ms": 250, "session_timeout_ms": 3000, "rebalance_timeout_ms": 20_000}


def test_s6_reshard_2_to_4_under_steady_production_loses_nothing_and_keeps_key_order(world: World) -> None:
    world.create(2, **GROUP_CONFIG)
    a, b = "a", "b"
    gate = f"{world.prefix}:gate"
    for mid in (a, b):
        world.start_cli_member(mid, gate=gate)
    world.wait(lambda: world.stable_with({a, b}), 30, "2 members STABLE")

    ledger = Ledger()
    keys = [f"k{i}" for i in range(60)]
    producer = SteadyProducer(world.producer(), ledger, keys)
    producer.start()
    try:
        def handled(n: int) -> bool:
            world.results.poll()
            return len(world.results.first) >= n

        world.wait(lambda: handled(500), 30, "steady state before the reshard")
        # One message of k0 whose handler is slow (it waits on a gate): its v1 shard cannot
        # drain until the gate opens, so the children of that shard must wait for it too.
        producer.gate_key = "k0"
        world.wait(lambda: producer.gated is not None and world.r.get(f"{gate}:waiting") == producer.gated.id,
                   20, "a member inside the slow handler")
        gated = producer.gated
        assert gated is not None
        slow_parent = gated.shard
        slow_children = [f"{world.stream}:2:{i}" for i in range(4)
                         if slow_parent in (f"{world.stream}:1:{i // 2}",)]
        other_children = [f"{world.stream}:2:{i}" for i in range(4) if f"{world.stream}:2:{i}" not in slow_children]
        assert len(slow_children) == 2

        start_reshard(world.stream, 4)
        v1_before_seal = producer.sent_to_version(1)

        def other_side_moved_on() -> bool:
            world.results.poll()
            on_children = {r.shard for r in world.results.records if r.shard in other_children}
            k0_waiting = sum(1 for k, _q, s in list(ledger.sent) if k == "k0" and s.shard in slow_children)
            return on_children == set(other_children) and k0_waiting >= 5

        world.wait(other_side_moved_on, 30, "the undelayed parent drained and its children consumed")
        # The delayed parent is sealed but not drained: none of its children is granted or read,
        # although the producer has been writing to them for a while (k0 among them).
        assert ShardVersion.objects.get(stream__name=world.stream, version=1).state == "SEALED"
        owners = world.owners()
        assert not set(owners) & set(slow_children), owners
        assert set(other_children) <= set(owners)
        world.results.poll()
        assert not [r for r in world.results.records if r.shard in slow_children]

        world.r.rpush(gate, "go")

        def resharded() -> bool:
            if Stream.objects.get(name=world.stream).state != "STABLE":
                return False
            return world.stable_with({a, b}) is not None

        world.wait(resharded, 60, "reshard finished: v1 retired, stream STABLE, group STABLE")
        after_retire = producer.sent
        world.wait(lambda: producer.sent >= after_retire + 300, 30, "production continuing on v2")
    finally:
        producer.stop()

    total = len(ledger.sent)
    world.wait(lambda: handled(total), 60, "every message handled")
    world.wait(lambda: world.total_pending() == 0, 30, "no pending entries left")

    world.assert_nothing_lost(ledger)
    world.assert_key_order(ledger)

    versions = {v.version: v.state for v in ShardVersion.objects.filter(stream__name=world.stream)}
    assert versions == {1: "RETIRED", 2: "ACTIVE"}
    assert Stream.objects.get(name=world.stream).state == "STABLE"
    doc = world.describe()
    children = [f"{world.stream}:2:{i}" for i in range(4)]
    owners = world.owners()
    assert sorted(owners) == children, owners
    assert sorted(len(m["assignedShards"]) for m in doc["members"]) == [2, 2]
    # The producer really wrote both versions, rerouted on the seal (its routing cache lives
    # 30 s, so only the refused append made it switch), and every key crossed the switch.
    assert v1_before_seal > 0
    assert producer.sent_to_version(2) > 300
    by_key: dict[str, set[int]] = {}
    for key, _seq, sent in ledger.sent:
        by_key.setdefault(key, set()).add(int(sent.shard.split(":")[1]))
    assert all(v == {1, 2} for v in by_key.values()), by_key
    # Per key, every v1 message was produced before every v2 message (no write after the seal).
    for key in by_key:
        versions_in_order = [int(s.shard.split(":")[1]) for k, _q, s in ledger.sent if k == key]
        assert versions_in_order == sorted(versions_in_order), key
    # Both members handled children (the drained parents' keys moved on).
    child_handlers = {r.member for r in world.results.records if r.shard.split(":")[1] == "2"}
    assert child_handlers == {a, b}
