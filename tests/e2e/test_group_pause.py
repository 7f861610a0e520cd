"""§11 group pause end to end: real coordinator (gunicorn on PostgreSQL), real Redis, real member
processes under a steady producer. Nothing is handled while the group is paused (even across a
rebalance that runs meanwhile), and nothing is lost or reordered across the pause and resume."""

from __future__ import annotations

import pytest

from groups.services import pause_group, resume_group

from .conftest import Ledger, SteadyProducer, World

pytestmark = [
    pytest.mark.needs_postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]

GROUP_CONFIG = {"heartbeat_interval_ms": 250, "session_timeout_ms": 5000, "rebalance_timeout_ms": 20_000}


def _saw_pause(world: World, member: str, times: int = 1) -> bool:
    return world.members[member].log_text().count("group paused") >= times


def test_s11_no_message_handled_while_paused_and_none_lost_or_reordered_under_load(world: World) -> None:
    world.create(6, **GROUP_CONFIG)
    ids = ["p0", "p1", "p2"]
    for mid in ids:
        world.start_cli_member(mid)
    world.wait(lambda: world.stable_with(set(ids)), 30, "3 members STABLE")
    ledger = Ledger()
    producer = SteadyProducer(world.producer(), ledger, [f"k{i}" for i in range(120)])
    producer.start()
    try:
        def handled(n: int) -> bool:
            world.results.poll()
            return len(world.results.records) >= n

        world.wait(lambda: handled(2000), 60, "2,000 messages handled before the pause")
        owners_before = world.owners()
        assert pause_group(world.group, actor="e2e")
        world.wait(lambda: all(_saw_pause(world, m) for m in ids), 15, "every member told PAUSED")
        # Each member finishes and ACKs what it had in flight, then reads nothing.
        world.wait(lambda: world.total_pending() == 0, 30, "in-flight work finished and ACKed")
        world.results.poll()
        handled_at_pause = len(world.results.records)

        # A rebalance while paused: a fourth member joins, shards are revoked (REVOKED at
        # in-flight 0) and granted to it, all without a single read.
        world.start_cli_member("p3")
        world.wait(lambda: world.stable_with({*ids, "p3"}), 45, "4 members STABLE while paused")
        world.wait(lambda: _saw_pause(world, "p3"), 15, "the joiner told PAUSED")
        doc = world.describe()
        assert doc["paused"] is True
        assert doc["pausedBy"] == "e2e"
        assert world.owners() != owners_before  # shards did move to the joiner
        sent_while_paused = producer.sent
        world.wait(lambda: producer.sent >= sent_while_paused + 1000, 30, "1,000 more produced while paused")
        world.results.poll()
        assert len(world.results.records) == handled_at_pause, "a message was handled while paused"
        assert world.total_pending() == 0, "an entry was read (entered a PEL) while paused"
        # The backlog waits in the shards, visible as lag (figures cached for up to 2 s).
        world.wait(lambda: (world.describe()["totals"]["lag"] or 0) > 0, 15, "the backlog shown as lag")

        assert resume_group(world.group, actor="e2e")
        world.wait(lambda: handled(handled_at_pause + 1), 15, "reading again after the resume")
    finally:
        producer.stop()

    def all_handled() -> bool:
        world.results.poll()
        return len(world.results.first) >= len(ledger.sent)

    world.wait(all_handled, 90, "every produced message handled")
    world.wait(lambda: world.total_pending() == 0, 30, "no pending entries left")
    world.assert_nothing_lost(ledger)
    world.assert_key_order(ledger)
    assert all(world.members[m].proc.poll() is None for m in [*ids, "p3"])
    assert all("group resumed" in world.members[m].log_text() for m in [*ids, "p3"])
