"""Issue 4, end to end: handler retries, the dead-letter queue after N deliveries and the
idempotency helper, in real member processes (``tests.e2e.member_app``: ``dataplane.Consumer``
with a handler that uses ``consumer.idempotency_marker``) against the real coordinator."""

from __future__ import annotations

import pytest

from .conftest import Ledger, World

pytestmark = [
    pytest.mark.needs_postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]

GROUP_CONFIG = {"heartbeat_interval_ms": 250, "session_timeout_ms": 3000, "rebalance_timeout_ms": 20_000}
MAX_DELIVERIES = 3


def test_retry_then_dlq_after_n_failures_and_idempotency_marker(world: World) -> None:
    world.create(4, **GROUP_CONFIG)
    a, b = "a", "b"
    for mid in (a, b):
        world.start_app_member(mid, "--max-deliveries", str(MAX_DELIVERIES))
    world.wait(lambda: world.stable_with({a, b}), 30, "2 members STABLE")

    ledger = Ledger()
    producer = world.producer()
    items: list[tuple[str, dict[str, str]]] = []
    for round_ in range(5):
        for i in range(20):  # ordinary keys
            (item,) = ledger.items([f"k{i}"], 1)
            items.append((item[0], {**item[1], "event": f"ev-k{i}-{round_}"}))
        for i in range(2):  # poison: every delivery fails -> DLQ; later messages of the key go on
            (item,) = ledger.items([f"bad{i}"], 1)
            fail = "always" if round_ in (1, 3) else ""
            items.append((item[0], {**item[1], "event": f"ev-bad{i}-{round_}", "fail": fail}))
        for i in range(3):  # transient: the first delivery fails, the retry succeeds
            (item,) = ledger.items([f"flaky{i}"], 1)
            items.append((item[0], {**item[1], "event": f"ev-flaky{i}-{round_}", "fail": "once"}))
    for i in range(3):  # the same event published twice (a producer retry): one side effect
        for _ in range(2):
            (item,) = ledger.items([f"dup{i}"], 1)
            items.append((item[0], {**item[1], "event": f"ev-dup{i}"}))
    sent = ledger.send(producer, items)
    fields_of = {s: f for (_k, f), s in zip(items, sent, strict=True)}
    poison = [s for (_k, f), s in zip(items, sent, strict=True) if f.get("fail") == "always"]
    good = [s for s in sent if s not in poison]
    assert len(poison) == 4

    def dlq_entries() -> dict[tuple[str, str], dict[str, str]]:
        out: dict[tuple[str, str], dict[str, str]] = {}
        for shard in world.shard_ids():
            for _rid, f in world.r.xrange(world.keys(shard).dlq(world.group)):
                out[(f["dlq:shard"], f["dlq:id"])] = f
        return out

    def done() -> bool:
        world.results.poll()
        return all(world.results.of(s) for s in good) and len(dlq_entries()) == len(poison)

    world.wait(done, 30, "good messages handled and poison messages dead-lettered")
    world.wait(lambda: world.total_pending() == 0, 20, "no pending entries left")

    # DLQ: each poison message once, with the error, the delivery count and its own fields;
    # ACKed on the source (nothing pending) and never recorded as handled.
    dlq = dlq_entries()
    assert sorted(dlq) == sorted((s.shard, s.id) for s in poison)
    for s in poison:
        entry = dlq[(s.shard, s.id)]
        assert entry["dlq:deliveries"] == str(MAX_DELIVERIES)
        assert entry["dlq:error"] == f"HandlerFailure: poison message for key {entry['key']}"
        assert entry["dlq:shard"] == s.shard
        assert entry["dlq:group"] == world.group
        assert entry["key"] in ("bad0", "bad1")
        assert entry["seq"] == fields_of[s]["seq"]
        assert entry["fail"] == "always"
        assert entry["event"] == fields_of[s]["event"]
        assert world.results.of(s) == []
        assert s.id not in world.pending_ids(s.shard)
        assert world.r.xrange(world.keys(s.shard).stream, s.id, s.id)  # still there: XACK, never XDEL
    # Retries: a transient failure is retried in place and succeeds on the second delivery.
    for s in good:
        recs = world.results.of(s)
        if fields_of[s].get("fail") == "once":
            assert [r.dc for r in recs] == [2], recs
        else:
            assert [r.dc for r in recs] == [1], recs
    # Idempotency: every event's side effect ran once; the duplicate publication was handled
    # but its marker said "seen", and the marker lives in the shard's slot with a TTL.
    for s in good:
        event = fields_of[s]["event"]
        assert world.r.get(f"{world.results_key}:effect:{event}") == "1", event
    for i in range(3):
        dups = [s for s in good if fields_of[s]["event"] == f"ev-dup{i}"]
        assert [world.results.of(s)[0].extra["first"] for s in dups] == ["1", "0"]
        marker = world.keys(dups[0].shard).idem(world.group, f"ev-dup{i}")
        assert world.r.exists(marker) == 1
        assert world.r.pttl(marker) > 0
    # The poison messages did not break per-key order of what followed them.
    world.assert_key_order(ledger, skip_keys=frozenset({"bad0", "bad1"}))
    for key in ("bad0", "bad1"):
        firsts = [r.seq for r in world.results.records if r.key == key]
        assert firsts == [0, 2, 4], (key, firsts)
    assert {r.member for r in world.results.records} == {a, b}
