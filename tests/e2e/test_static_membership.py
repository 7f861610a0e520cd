"""Issue 11, end to end: static membership (PROTOCOL.md §9) with real member processes against
the real coordinator (gunicorn on PostgreSQL) and real Redis.

- a rolling restart of 4 static members over 8 shards under steady production moves no shard
  to another member, loses nothing and keeps per-key order;
- a crashed (SIGKILL) static member's shards wait for its session timeout, then move;
- a duplicate instance replaces the old member, and the old one's late ACK is refused by the
  fence token;
- two live processes with one instance id do not replace each other forever: the older one is
  told so (R1s marker), exits with code 2 and one line, the newer keeps every shard.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta

import pytest

from assignments.models import ShardAssignment
from groups.models import Event
from members.models import Member

from .conftest import Ledger, MemberProc, SteadyProducer, World, child_pids

pytestmark = [
    pytest.mark.needs_postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]


def start_static(world: World, member_id: str, instance_id: str, gate: str | None = None) -> MemberProc:
    argv = [
        sys.executable, "-m", "tests.e2e.static_member",
        "--coordinator", world.server.url, "--group", world.group, "--api-key", world.group_key,
        "--redis", world.redis_url, "--member-id", member_id, "--instance-id", instance_id,
    ]
    extra = {"E2E_GATE": gate} if gate else {}
    return world._spawn(member_id, argv, world.env(member_id, **extra))


def wait_all_handled(world: World, ledger: Ledger, timeout: float) -> None:
    def all_handled() -> bool:
        world.results.poll()
        return len(world.results.first) >= len(ledger.sent)

    world.wait(all_handled, timeout, "every message handled")


def targets() -> dict[str, str | None]:
    return dict(ShardAssignment.objects.values_list("shard__shard_id", "target__instance_id"))


def test_rolling_restart_of_static_members_moves_no_shard_to_another_member(world: World) -> None:
    # Session timeout long enough for a process restart on a loaded machine (a restart that
    # outlasts it is a crash: L1s, and its shards do move); heartbeats fast so the test is quick.
    world.create(8, heartbeat_interval_ms=250, session_timeout_ms=60_000, rebalance_timeout_ms=60_000)
    incarnation = {f"inst-{i}": f"m{i}" for i in range(4)}
    for inst, mid in incarnation.items():
        start_static(world, mid, inst)
    world.wait(lambda: world.stable_with(set(incarnation.values())), 60, "4 static members STABLE")
    by_instance = {inst: sorted(s for s, m in world.owners().items() if m == mid)
                   for inst, mid in incarnation.items()}
    assert sorted(len(s) for s in by_instance.values()) == [2, 2, 2, 2]
    instance_of_shard = {s: inst for inst, shards in by_instance.items() for s in shards}
    settled_at = Event.objects.filter(group__name=world.group).order_by("-id").values_list("id", flat=True)[0]

    keys = [f"k{i}" for i in range(100)]
    ledger = Ledger()
    steady = SteadyProducer(world.producer(), ledger, keys)
    steady.start()
    try:
        for n, inst in enumerate(sorted(incarnation)):
            old = incarnation[inst]
            sent = steady.sent
            world.wait(lambda s=sent: steady.sent >= s + 100, 10, "production going on")
            world.members[old].proc.send_signal(signal.SIGTERM)  # drains in-flight work, sends -2
            assert world.members[old].proc.wait(30) == 0, world.diag()
            assert Member.objects.get(group__name=world.group, member_id=old).status == "TEMPORARILY_LEFT"
            new = f"{old}-restart{n}"
            incarnation[inst] = new
            start_static(world, new, inst)
            world.wait(lambda: world.stable_with(set(incarnation.values())), 50, f"{new} back in place of {old}")
            assert sorted(s for s, m in world.owners().items() if m == new) == by_instance[inst]
        sent = steady.sent
        world.wait(lambda: steady.sent >= sent + 200, 10, "production going on after the restarts")
    finally:
        steady.stop()

    wait_all_handled(world, ledger, 60)
    world.wait(lambda: world.total_pending() == 0, 30, "no pending entries left")
    world.assert_nothing_lost(ledger)
    world.assert_key_order(ledger)

    # 0 shards granted to another member: nothing was rebalanced or expired, the target never
    # moved, and every handling of a shard was by an incarnation of the instance holding it.
    kinds = list(Event.objects.filter(group__name=world.group, id__gt=settled_at).values_list("kind", flat=True))
    assert kinds.count("left_temporarily") == 4
    assert kinds.count("joined") == 4
    assert not {"rebalanced", "expired", "fenced", "left"} & set(kinds), kinds
    assert targets() == instance_of_shard
    moved = {(rec.shard, rec.member) for rec in world.results.records
             if not rec.member.startswith(f"m{instance_of_shard[rec.shard].split('-')[1]}")}
    assert not moved, f"shards handled by another member: {sorted(moved)[:10]}"
    for shard, inst in instance_of_shard.items():  # fence tokens: the last incarnation's grants
        assert (world.r.get(world.keys(shard).fence(world.group)) or "").endswith(f":{incarnation[inst]}")


def test_crashed_static_member_keeps_its_shards_until_the_session_timeout(world: World) -> None:
    world.create(4, heartbeat_interval_ms=250, session_timeout_ms=4000, rebalance_timeout_ms=20_000)
    start_static(world, "a", "inst-a")
    start_static(world, "b", "inst-b")
    world.wait(lambda: world.stable_with({"a", "b"}), 30, "2 static members STABLE")
    a_shards = sorted(s for s, m in world.owners().items() if m == "a")
    ledger = Ledger()
    producer = world.producer()
    ledger.send(producer, ledger.items([f"k{i}" for i in range(40)], 400))

    world.members["a"].proc.kill()  # SIGKILL: no -2, no leave
    world.members["a"].proc.wait(10)
    killed_at = time.monotonic()
    # Until the session timeout it stays in the group and its shards go to nobody else.
    while time.monotonic() - killed_at < 2.5:
        world.tick()
        assert sorted(s for s, m in world.owners().items() if m == "a") == a_shards
        time.sleep(0.1)  # sampling interval of an observation window, not synchronisation
    world.wait(lambda: world.stable_with({"b"}), 30, "a expired (L1) and b holding every shard")
    assert time.monotonic() - killed_at >= 3.5  # 4 s session timeout, last heartbeat <= 0.25 s before the kill
    assert Member.objects.get(group__name=world.group, member_id="a").status == "EXPIRED"
    assert set(world.owners().values()) == {"b"}
    assert sorted(world.owners()) == world.shard_ids()
    wait_all_handled(world, ledger, 30)
    world.assert_nothing_lost(ledger)
    world.assert_key_order(ledger)


def test_duplicate_instance_replaces_the_old_member_whose_late_ack_is_refused(world: World) -> None:
    world.create(4, heartbeat_interval_ms=250, session_timeout_ms=60_000, rebalance_timeout_ms=60_000)
    gates = {m: f"{world.prefix}:gate:{m}" for m in ("old", "dup")}
    start_static(world, "old", "inst-0", gate=gates["old"])
    start_static(world, "other", "inst-1")
    world.wait(lambda: world.stable_with({"old", "other"}), 30, "2 static members STABLE")
    old_shards = sorted(s for s, m in world.owners().items() if m == "old")

    ledger = Ledger()
    producer = world.producer()
    gate_key = next(k for k in (f"gate-{i}" for i in range(1000)) if world.route(k, 4) in old_shards)
    (gated,) = ledger.send(producer, ledger.items([gate_key], 1, gate="1"))
    world.wait(lambda: world.r.get(f"{gates['old']}:waiting") == gated.id, 20, "old inside the gated handler")
    tokens_before = {s: world.r.get(world.keys(s).fence(world.group)) for s in old_shards}
    os.kill(world.members["old"].pid, signal.SIGSTOP)  # it cannot notice being replaced

    start_static(world, "dup", "inst-0", gate=gates["dup"])
    world.wait(lambda: world.stable_with({"dup", "other"}), 60, "dup in old's place")
    replaced = Member.objects.get(group__name=world.group, member_id="old")
    assert replaced.status == "LEFT"
    assert "replaced" in replaced.fenced_reason
    assert sorted(s for s, m in world.owners().items() if m == "dup") == old_shards
    world.wait(lambda: world.r.get(f"{gates['dup']}:waiting") == gated.id, 20, "dup took over the gated message")
    for s in old_shards:
        token = world.r.get(world.keys(s).fence(world.group)) or ""
        assert token.endswith(":dup")
        assert int(token.split(":")[0]) > int(tokens_before[s].split(":")[0])

    # The old process resumes with the coordinator stalled, so nothing tells it it was replaced
    # before its handler finishes: Redis's fence token is all that stops it. Two orders are
    # possible, both fenced: the handler finishes first, its ACK goes to Redis and the token
    # refuses it ("ACK refused"); or the resumed reader's next read is refused first, the
    # shard is marked lost and the ACK is withheld ("read refused"; seen about once in 13 runs).
    workers = child_pids(world.server.process.pid)

    def old_fenced() -> bool:
        world.results.poll()
        log = world.members["old"].log_text()
        handled = any(rec.member == "old" for rec in world.results.of(gated))  # it did, late
        return handled and ("ACK refused" in log or "read refused" in log)

    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    try:
        world.r.rpush(gates["old"], "go")
        os.kill(world.members["old"].pid, signal.SIGCONT)
        world.wait(old_fenced, 20, "old handled the message late and met the fence")
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
    # Once the coordinator answers again, old learns it was replaced (R1s) and stops for good
    # instead of rejoining (which would replace dup in turn).
    # Consumer.run() raises InstanceIdReplaced (this runner leaves it uncaught: exit 1).
    world.wait(lambda: world.members["old"].proc.poll() is not None, 30, "old stopped")
    # Checked once old has exited, so no ACK of its can still be on its way.
    assert gated.id in world.pending_ids(gated.shard, "dup"), "old's stale ACK went through"
    assert world.members["old"].proc.returncode == 1, world.diag()
    assert ("InstanceIdReplaced: another process joined with instance id inst-0 (member dup)"
            in world.members["old"].log_text()), world.diag()
    world.r.rpush(gates["dup"], *["go"] * 5)  # spare ones: each gated handling takes one
    world.wait(lambda: world.stable_with({"dup", "other"}), 60, "dup and other STABLE")
    world.wait(lambda: world.total_pending() == 0, 30, "no pending entries left")
    world.assert_nothing_lost(ledger)


def test_r1s_replaced_member_stops_with_exit_code_2_and_the_newer_keeps_every_shard(world: World) -> None:
    """Two live CLI consumers with one --instance-id (Kafka: FENCED_INSTANCE_ID, the newest
    wins). Without the R1s marker the older would rejoin, replace the newer, and so on."""
    world.create(4, heartbeat_interval_ms=250, session_timeout_ms=60_000, rebalance_timeout_ms=60_000)
    first = world.start_cli_member("first", "--instance-id", "inst-0")
    world.wait(lambda: world.stable_with({"first"}), 30, "first STABLE with every shard")
    ledger = Ledger()
    producer = world.producer()
    ledger.send(producer, ledger.items([f"k{i}" for i in range(20)], 200))

    world.start_cli_member("second", "--instance-id", "inst-0")
    world.wait(lambda: first.proc.poll() is not None, 30, "first stopped")
    assert first.proc.returncode == 2, world.diag()
    log = first.log_text()
    assert "error: another process joined with instance id inst-0 (member second); this one stops" in log
    assert "Traceback" not in log, log
    doc = world.wait(lambda: world.stable_with({"second"}), 30, "second STABLE with every shard")
    assert sorted(world.owners()) == world.shard_ids()
    assert set(world.owners().values()) == {"second"}

    # The group's epoch stops rising: second heartbeats on for 2 s (8 intervals, seen by the
    # coordinator) and nothing rejoins, replaces or rebalances meanwhile.
    seen = Member.objects.get(group__name=world.group, member_id="second").last_heartbeat_at
    world.wait(lambda: Member.objects.get(group__name=world.group, member_id="second")
               .last_heartbeat_at >= seen + timedelta(seconds=2), 30, "second heartbeating 2 s on")
    assert world.stable_with({"second"}) is not None
    assert world.describe()["groupEpoch"] == doc["groupEpoch"]
    kinds = list(Event.objects.filter(group__name=world.group).values_list("kind", flat=True))
    assert kinds.count("joined") == 2, kinds
    assert kinds.count("replaced") == 1, kinds
    assert "rejoined" not in kinds, kinds
    assert Member.objects.get(group__name=world.group, member_id="first").status == "LEFT"

    ledger.send(producer, ledger.items([f"k{i}" for i in range(20)], 100, start=200))
    wait_all_handled(world, ledger, 60)
    world.wait(lambda: world.total_pending() == 0, 30, "no pending entries left")
    world.assert_nothing_lost(ledger)
