"""The consumer runtime on the real Redis, driven through its seam (no coordinator)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis
from redis.crc import key_slot

from dataplane import scripts
from dataplane.message import Message
from dataplane.routing import ShardKeys
from dataplane.runtime import ack_mode_from_capabilities, detect_ack_mode
from dataplane.runtime.fenced_read import FencedReader
from dataplane.runtime.shard_table import ShardState, ShardStatus, ShardTable, StopShard

from .conftest import group_info, make_grant, pending, wait_until


def test_per_key_order_with_parallel_workers(r, prefix, start_runtime) -> None:
    shards = [f"s:1:{i}" for i in range(3)]
    keys = [f"k{i}" for i in range(40)]
    n_per_key = 60
    expected: dict[str, list[int]] = defaultdict(list)
    for seq in range(n_per_key):
        for shard_no, shard in enumerate(shards):
            pipe = r.pipeline(transaction=False)
            for k in keys[shard_no::3]:
                pipe.xadd(ShardKeys(shard, prefix).stream, {"key": k, "seq": str(seq)})
                expected[k].append(seq)
            pipe.execute()
    seen: dict[str, list[int]] = defaultdict(list)
    threads: set[str] = set()
    lock = threading.Lock()
    total = sum(len(v) for v in expected.values())

    def handler(msg: Message) -> None:
        # The per-key list is only appended by the worker that owns the key: no lock needed
        # for order; the lock guards the dict and thread set.
        with lock:
            seen[msg.key].append(int(msg.fields["seq"]))
            threads.add(threading.current_thread().name)

    rt = start_runtime(handler, workers=4, batch_size=50)
    for shard in shards:
        rt.grant(make_grant(prefix, shard))
    wait_until(lambda: sum(len(v) for v in seen.values()) >= total, what="all handled")
    assert dict(seen) == dict(expected)
    assert len(threads) > 1  # keys really ran on several workers
    wait_until(
        lambda: all(pending(r, ShardKeys(s, prefix).stream) == 0 for s in shards),
        what="acks flushed",
    )


def test_pending_recovery_after_crash_in_id_order(r, prefix, start_runtime) -> None:
    shard = "s:1:0"
    stream = ShardKeys(shard, prefix).stream
    r.xgroup_create(stream, "g", id="0", mkstream=True)
    ids = [r.xadd(stream, {"key": f"k{i % 3}", "n": str(i)}) for i in range(12)]
    # A crashed old owner read 0..5 without ACKing; we ourselves had read 6..8 earlier.
    r.xreadgroup("g", "old-owner", {stream: ">"}, count=6)
    r.xreadgroup("g", "m-1", {stream: ">"}, count=3)
    got: list[Message] = []
    rt = start_runtime(got.append, workers=1)
    rt.grant(make_grant(prefix, shard, epoch=2))
    wait_until(lambda: len(got) >= 12, what="recovered + new")
    assert [m.id for m in got] == ids  # own and others' pending, then new, in ID order
    assert all(m.delivery_count >= 2 for m in got[:9])
    assert all(m.delivery_count == 1 for m in got[9:])
    wait_until(lambda: pending(r, stream) == 0, what="all acked")


def test_fence_token_refuses_stale_ack(r, prefix, start_runtime) -> None:
    shard = "s:1:0"
    keys = ShardKeys(shard, prefix)
    release = threading.Event()
    started = threading.Event()

    def handler(msg: Message) -> None:
        started.set()
        assert release.wait(10)

    rt = start_runtime(handler, workers=1)
    rt.grant(make_grant(prefix, shard, epoch=3, member="m-1"))
    wait_until(lambda: rt.status(shard) == "ACTIVE", what="shard active")
    assert r.get(keys.fence("g")) == "3:m-1"
    r.xadd(keys.stream, {"key": "a"})
    assert started.wait(10)
    # The shard moved on: the next owner raised the token while we were still handling.
    ok, token = scripts.fence_raise(r, [keys.fence("g")], [4, "m-2"])
    assert ok == 1
    assert token == "4:m-2"
    release.set()
    wait_until(lambda: rt.in_flight(shard) == 0, what="batch finished")
    assert pending(r, keys.stream) == 1  # the stale ACK was refused
    assert rt.pop_lost() == {shard}
    # A lower or equal-epoch raise by someone else is refused; the token never goes back.
    assert scripts.fence_raise(r, [keys.fence("g")], [3, "m-1"])[0] == 0
    assert scripts.fence_raise(r, [keys.fence("g")], [4, "m-1"])[0] == 0
    assert scripts.fence_raise(r, [keys.fence("g")], [4, "m-2"])[0] == 1


def test_grant_below_current_fence_is_not_read(r, prefix, start_runtime) -> None:
    shard = "s:1:0"
    keys = ShardKeys(shard, prefix)
    r.set(keys.fence("g"), "9:m-2")
    got: list[Message] = []
    rt = start_runtime(got.append)
    r.xadd(keys.stream, {"key": "a"})
    rt.grant(make_grant(prefix, shard, epoch=5))
    wait_until(lambda: rt.status(shard) == "LOST", what="grant refused")
    assert rt.pop_lost() == {shard}
    assert got == []


def test_retry_then_dlq_after_max_deliveries(r, prefix, start_runtime) -> None:
    shard = "s:1:0"
    keys = ShardKeys(shard, prefix)
    calls: dict[str, int] = defaultdict(int)
    ok: list[str] = []

    def handler(msg: Message) -> None:
        calls[msg.fields["n"]] += 1
        if msg.key == "bad":
            raise ValueError(f"boom {msg.delivery_count}")
        ok.append(msg.fields["n"])

    rt = start_runtime(handler, workers=2, max_deliveries=3)
    rt.grant(make_grant(prefix, shard))
    wait_until(lambda: rt.status(shard) == "ACTIVE")
    r.xadd(keys.stream, {"key": "good", "n": "1"})
    bad_id = r.xadd(keys.stream, {"key": "bad", "n": "2", "payload": "x"})
    r.xadd(keys.stream, {"key": "good", "n": "3"})
    wait_until(lambda: r.xlen(keys.dlq("g")) == 1 and len(ok) == 2, what="DLQ entry")
    wait_until(lambda: pending(r, keys.stream) == 0, what="all acked")
    assert calls["2"] == 3
    [(_id, dlq_fields)] = r.xrange(keys.dlq("g"))
    assert dlq_fields["dlq:deliveries"] == "3"
    assert dlq_fields["dlq:error"] == "ValueError: boom 3"
    assert dlq_fields["dlq:id"] == bad_id
    assert dlq_fields["dlq:shard"] == shard
    assert dlq_fields["payload"] == "x"
    assert dlq_fields["key"] == "bad"
    # Every message, the DLQ'd one included, is accounted for: a revocation can complete.
    rt.revoke(shard)
    wait_until(lambda: rt.in_flight(shard) == 0, what="in-flight back to 0")


def test_recovered_message_past_max_deliveries_goes_to_dlq_unrun(r, prefix, start_runtime):
    shard = "s:1:0"
    keys = ShardKeys(shard, prefix)
    r.xgroup_create(keys.stream, "g", id="0", mkstream=True)
    r.xadd(keys.stream, {"key": "poison"})
    for _ in range(3):  # it crashed three consumers in a row
        r.xreadgroup("g", "crashed", {keys.stream: "0" if _ else ">"}, count=1)
    ran: list[Message] = []
    rt = start_runtime(ran.append, max_deliveries=3)
    rt.grant(make_grant(prefix, shard))
    wait_until(lambda: r.xlen(keys.dlq("g")) == 1, what="DLQ")
    wait_until(lambda: pending(r, keys.stream) == 0)
    assert ran == []
    rt.revoke(shard)
    wait_until(lambda: rt.in_flight(shard) == 0, what="in-flight back to 0")


def test_idempotency_marker(r, prefix, start_runtime) -> None:
    rt = start_runtime(lambda m: None)
    msg = Message("s:1:0", "1-0", "k", {"key": "k"})
    rt.grant(make_grant(prefix, "s:1:0"))
    wait_until(lambda: rt.status("s:1:0") == "ACTIVE")
    assert rt.idempotency_marker(msg, "order-42", 60_000) is True
    assert rt.idempotency_marker(msg, "order-42", 60_000) is False
    key = ShardKeys("s:1:0", prefix).idem("g", "order-42")
    assert 0 < r.pttl(key) <= 60_000
    assert key_slot(key.encode()) == key_slot(ShardKeys("s:1:0", prefix).stream.encode())


@pytest.mark.parametrize(
    ("info", "version", "expected"),
    [
        ([None], "7.0.15", "XACK"),
        ([None], None, "XACK"),
        ([["xackdel", -5, ["write", "fast"], 1, 1, 1]], "8.2.1", "XACKDEL"),
        ([["xackdel", -5, ["write", "fast"], 1, 1, 1]], None, "XACKDEL"),
        (None, "8.2.0", "XACKDEL"),
        (None, "8.4.0", "XACKDEL"),
        (None, "8.0.2", "XACK"),
        (None, "7.4.1", "XACK"),
        (None, None, "XACK"),
        ({"xackdel": {"name": "xackdel"}}, None, "XACKDEL"),
    ],
)
def test_ack_command_selection(info, version, expected) -> None:
    assert ack_mode_from_capabilities(info, version) == expected


def test_this_server_gets_xack_and_acks_for_real(r, prefix, start_runtime) -> None:
    assert r.info("server")["redis_version"].startswith("7.")
    assert detect_ack_mode(r) == "XACK"
    rt = start_runtime(lambda m: None)
    assert rt.ack_mode == "XACK"
    keys = ShardKeys("s:1:0", prefix)
    rt.grant(make_grant(prefix, "s:1:0"))
    for i in range(5):
        r.xadd(keys.stream, {"key": str(i)})
    # The group appears only once the runtime has applied the grant: the predicate must not
    # index a list that is still empty.
    wait_until(lambda: (group_info(r, keys.stream) or {}).get("entries-read") == 5)
    wait_until(lambda: pending(r, keys.stream) == 0)
    assert r.xlen(keys.stream) == 5  # XACK never deletes entries


def test_drain_detection(r, prefix, start_runtime) -> None:
    shard = "s:1:0"
    keys = ShardKeys(shard, prefix)
    gate = threading.Event()
    rt = start_runtime(lambda m: gate.wait(10), drain_check_ms=20)
    for i in range(5):
        r.xadd(keys.stream, {"key": str(i)})
    rt.grant(make_grant(prefix, shard))
    wait_until(lambda: rt.status(shard) == "ACTIVE")
    r.set(keys.sealed, "1")
    # Sealed but with entries pending: not drained.
    wait_until(lambda: pending(r, keys.stream) > 0)
    assert scripts.drained(r, [keys.stream, keys.sealed], ["g"]) == 0
    assert shard not in rt.drained_shards()
    gate.set()
    wait_until(lambda: shard in rt.drained_shards(), what="drained")


def test_drain_script_ignores_lag_and_handles_trimmed_streams(r, prefix) -> None:
    keys = ShardKeys("s:1:0", prefix)
    r.xgroup_create(keys.stream, "g", id="0", mkstream=True)
    args = ([keys.stream, keys.sealed], ["g"])
    assert scripts.drained(r, *args) == 0  # not sealed
    r.set(keys.sealed, "1")
    assert scripts.drained(r, *args) == 1  # sealed and empty
    ids = [r.xadd(keys.stream, {"key": str(i)}) for i in range(4)]
    assert scripts.drained(r, *args) == 0  # unread entries
    r.xreadgroup("g", "c", {keys.stream: ">"}, count=2)
    assert scripts.drained(r, *args) == 0
    r.xack(keys.stream, "g", *ids[:2])
    r.xdel(keys.stream, ids[1])  # a delete makes XINFO `lag` unreliable
    assert scripts.drained(r, *args) == 0  # still two unread
    r.xreadgroup("g", "c", {keys.stream: ">"})
    assert scripts.drained(r, *args) == 0  # read but pending
    r.xack(keys.stream, "g", *ids[2:])
    r.xtrim(keys.stream, maxlen=0)  # everything trimmed away
    assert scripts.drained(r, *args) == 1
    # A group that does not exist has not drained anything that is there.
    r.xadd(keys.stream, {"key": "late"})
    assert scripts.drained(r, [keys.stream, keys.sealed], ["other"]) == 0


def test_revoke_finishes_current_leaves_queued_pending(r, prefix, start_runtime) -> None:
    shard = "s:1:0"
    keys = ShardKeys(shard, prefix)
    entered = threading.Event()
    release = threading.Event()
    handled: list[str] = []

    def handler(msg: Message) -> None:
        entered.set()
        release.wait(10)
        handled.append(msg.id)

    rt = start_runtime(handler, workers=1, batch_size=10)
    rt.grant(make_grant(prefix, shard))
    wait_until(lambda: rt.status(shard) == "ACTIVE")
    ids = [r.xadd(keys.stream, {"key": "same"}) for _ in range(5)]
    assert entered.wait(10)
    wait_until(lambda: pending(r, keys.stream) == 5, what="all five read, one in progress")
    rt.revoke(shard)
    assert rt.in_flight(shard) > 0
    release.set()
    wait_until(lambda: rt.in_flight(shard) == 0, what="revocation done")
    assert handled == ids[:1]  # the one in progress finished and was ACKed
    assert pending(r, keys.stream) == 4  # the rest waits for the next owner, in its PEL order
    # The next owner recovers them in ID order.
    got: list[str] = []
    rt2 = start_runtime(lambda m: got.append(m.id), consumer="m-2")
    rt2.grant(make_grant(prefix, shard, epoch=2, member="m-2"))
    wait_until(lambda: got == ids[1:], what="next owner recovered")


def test_a_slow_handler_on_one_shard_does_not_hold_back_another_shards_acks(
    r, prefix, start_runtime
) -> None:
    """One read over two shards lands in one lane as two batches (a before b): a's ACK goes
    out as soon as a's batch is done, while b's handler still runs, so revoking a is not
    held up by b."""
    a, b = ShardKeys("s:1:0", prefix), ShardKeys("s:1:1", prefix)
    release = threading.Event()

    def handler(msg: Message) -> None:
        if msg.shard == "s:1:1":
            release.wait(30)  # longer than the wait for a below

    rt = start_runtime(handler, workers=1)
    for shard in ("s:1:0", "s:1:1"):
        rt.grant(make_grant(prefix, shard))
    wait_until(lambda: rt.status("s:1:0") == rt.status("s:1:1") == "ACTIVE")
    pipe = r.pipeline(transaction=True)  # both in one step: the next read gets both
    pipe.xadd(a.stream, {"key": "x"})
    pipe.xadd(b.stream, {"key": "x"})
    pipe.execute()
    try:
        wait_until(lambda: pending(r, b.stream) == 1, what="b read, its handler blocked")
        wait_until(lambda: rt.in_flight("s:1:0") == 0, what="a finished while b runs")
        assert not release.is_set()
        assert pending(r, a.stream) == 0
    finally:
        release.set()
    wait_until(lambda: pending(r, b.stream) == 0, what="b acked once released")


def test_abort_stops_acks(r, prefix, start_runtime) -> None:
    shard = "s:1:0"
    keys = ShardKeys(shard, prefix)
    entered = threading.Event()
    release = threading.Event()

    def handler(msg: Message) -> None:
        entered.set()
        release.wait(10)

    rt = start_runtime(handler, workers=1)
    rt.grant(make_grant(prefix, shard))
    wait_until(lambda: rt.status(shard) == "ACTIVE")
    r.xadd(keys.stream, {"key": "a"})
    assert entered.wait(10)
    rt.abort(shard)
    release.set()
    wait_until(lambda: rt.in_flight(shard) == 0)
    assert pending(r, keys.stream) == 1


def test_ack_before_mode_acks_then_runs(r, prefix, start_runtime) -> None:
    shard = "s:1:0"
    keys = ShardKeys(shard, prefix)
    seen_pending: list[int] = []
    rt = start_runtime(lambda m: seen_pending.append(pending(r, keys.stream)), ack="before")
    rt.grant(make_grant(prefix, shard))
    wait_until(lambda: rt.status(shard) == "ACTIVE")
    r.xadd(keys.stream, {"key": "a"})
    wait_until(lambda: len(seen_pending) == 1)
    assert seen_pending == [0]  # already ACKed while the handler ran


def test_start_position_latest_skips_history(r, prefix, start_runtime) -> None:
    shard = "s:1:0"
    keys = ShardKeys(shard, prefix)
    r.xadd(keys.stream, {"key": "old"})
    got: list[str] = []
    rt = start_runtime(lambda m: got.append(m.key))
    rt.grant(make_grant(prefix, shard, start="$"))
    wait_until(lambda: rt.status(shard) == "ACTIVE")
    r.xadd(keys.stream, {"key": "new"})
    wait_until(lambda: got == ["new"])


def test_c4_late_refusal_for_an_aborted_grant_is_not_a_new_loss(prefix) -> None:
    table = ShardTable(max_in_flight=10)
    st = table.install(make_grant(prefix, "s:1:0", epoch=3))
    table.enqueue(StopShard("s:1:0", ShardStatus.ABORTED))
    table.mark_lost(st)  # what an ACK refused after the abort does
    assert table.pop_lost() == set()
    assert table.status("s:1:0") == ShardStatus.ABORTED


def test_late_refusal_for_a_replaced_grant_is_not_a_new_loss(prefix) -> None:
    table = ShardTable(max_in_flight=10)
    old = table.install(make_grant(prefix, "s:1:0", epoch=3))
    table.install(make_grant(prefix, "s:1:0", epoch=4))
    table.mark_lost(old)
    assert table.pop_lost() == set()
    assert table.status("s:1:0") == ShardStatus.STARTING
    table.mark_lost(table.get("s:1:0"))
    assert table.pop_lost() == {"s:1:0"}
    assert table.pop_lost() == set()  # an event: reported once


def test_fenced_read_refused_for_a_member_frozen_between_lease_check_and_read(
    r, prefix, start_runtime
) -> None:
    shard = "s:1:0"
    keys = ShardKeys(shard, prefix)
    got: list[Message] = []
    rt = start_runtime(got.append)
    rt.read_deadline = time.monotonic() + 3600  # by its own clock the member's lease holds
    rt.grant(make_grant(prefix, shard, epoch=3, member="m-1"))
    wait_until(lambda: rt.status(shard) == "ACTIVE", what="shard active")
    # Frozen after its lease check: meanwhile the coordinator moved the shard on and the next
    # owner raised the fence token. Then an entry arrives and the frozen member's read runs.
    assert scripts.fence_raise(r, [keys.fence("g")], [4, "m-2"])[0] == 1
    r.xadd(keys.stream, {"key": "a"})
    wait_until(lambda: rt.status(shard) == "LOST", what="read refused")
    assert rt.pop_lost() == {shard}
    assert got == []
    assert pending(r, keys.stream) == 0  # nothing entered any PEL: the next owner reads it
    assert (group_info(r, keys.stream) or {}).get("entries-read") in (0, None)


def test_fenced_read_script_reads_only_shards_whose_token_is_ours(r, prefix) -> None:
    a, b = ShardKeys("s:1:0", prefix), ShardKeys("s:1:1", prefix)
    for k in (a, b):
        r.xgroup_create(k.stream, "g", id="0", mkstream=True)
        r.xadd(k.stream, {"key": "x"})
    r.set(a.fence("g"), "2:m-1")
    r.set(b.fence("g"), "3:m-2")  # b moved on to m-2
    keys = [a.stream, a.fence("g"), b.stream, b.fence("g")]
    refused, reply, tails = scripts.fenced_read(r, keys, ["g", "m-1", 10, "2:m-1", "2:m-1"])
    assert refused == [2]
    assert [stream for stream, _entries in reply] == [a.stream]
    assert tails is None
    assert pending(r, a.stream) == 1
    assert pending(r, b.stream) == 0
    # Nothing new on a: no reply, and the id to wait after with XREAD BLOCK.
    refused, reply, tails = scripts.fenced_read(r, keys[:2], ["g", "m-1", 10, "2:m-1"])
    assert refused == []
    assert reply is None
    assert tails == [r.xrevrange(a.stream, count=1)[0][0]]


def test_fenced_read_aborts_when_the_token_moves_between_the_check_and_the_read(r, prefix):
    """The member is frozen after its fence check (WATCH + MGET) and before the read (MULTI
    XREADGROUP EXEC): the next owner raises the token in that gap, and Redis runs nothing."""
    keys, st = shard_with_one_entry(r, prefix)
    sent: list[int] = []

    def frozen_before_the_read() -> None:
        if len(sent) == 2:  # the check went out; the read is next: the token moves now
            assert scripts.fence_raise(r, [keys.fence("g")], [4, "m-2"])[0] == 1

    with fenced_reader(r, sent, frozen_before_the_read) as reader:
        res = reader.read([st])
        assert res.aborted
        assert res.entries == {}
        assert pending(r, keys.stream) == 0  # nothing entered m-1's PEL
        # Its next read sees the new token at the check and refuses the shard.
        assert reader.read([st]).refused == [st]
    with fenced_reader(r) as fresh:
        assert fresh.read([st]).refused == [st]


def test_fenced_read_aborts_when_the_token_moves_after_the_check_sent_with_the_last_read(r, prefix):
    """While entries flow the next read's check rides in the previous read's write: a token
    raised after that check, while the member handles the batch (or is frozen), makes the
    next read's EXEC abort, so nothing enters the stale member's PEL."""
    keys, st = shard_with_one_entry(r, prefix)
    sent: list[int] = []
    with fenced_reader(r, sent, count=1) as reader:
        first = reader.read([st])
        assert [e[0] for e in first.entries[keys.stream]] == [r.xrange(keys.stream)[0][0]]
        assert len(sent) == 2  # the first check, then the read with the next check
        assert scripts.fence_raise(r, [keys.fence("g")], [4, "m-2"])[0] == 1
        r.xadd(keys.stream, {"key": "b"})
        second = reader.read([st])
        assert len(sent) == 3  # no check of its own: the one sent with the first read
        assert second.aborted
        assert second.entries == {}
        assert pending(r, keys.stream) == 1  # only "a", read while the token was ours
        assert reader.read([st]).refused == [st]


def test_fenced_read_empty_after_a_full_read_asks_for_the_tails_before_waiting(r, prefix):
    """A read that filled COUNT leaves the tails (XREVRANGE) out of the next one; if that
    one comes back empty it gives no ID to wait after (the reader reads again at once), and
    the read after it does: the stream's last entry, so XREAD BLOCK misses nothing."""
    keys, st = shard_with_one_entry(r, prefix)
    with fenced_reader(r, count=1) as reader:
        assert list(reader.read([st]).entries) == [keys.stream]  # full: COUNT 1, one entry
        empty = reader.read([st])
        assert empty.entries == {}
        assert empty.waits == {}
        assert not empty.aborted
        last = r.xadd(keys.stream, {"key": "b"})
        assert list(reader.read([st]).entries) == [keys.stream]
        assert reader.read([st]).waits == {}
        assert reader.read([st]).waits == {keys.stream: last}


def shard_with_one_entry(r, prefix) -> tuple[ShardKeys, ShardState]:
    """Shard s:1:0 granted to m-1 at epoch 3 (its token in Redis), one entry "a" unread."""
    keys = ShardKeys("s:1:0", prefix)
    r.xgroup_create(keys.stream, "g", id="0", mkstream=True)
    r.xadd(keys.stream, {"key": "a"})
    r.set(keys.fence("g"), "3:m-1")
    return keys, ShardTable(10).install(make_grant(prefix, "s:1:0", epoch=3, member="m-1"))


@contextmanager
def fenced_reader(
    r, sent: list[int] | None = None, before_send=None, count: int = 10
) -> Iterator[FencedReader]:
    """A FencedReader on a connection of its own; ``sent`` counts its writes, ``before_send``
    runs before each (a member frozen at that point)."""
    pool = redis.ConnectionPool(**r.connection_pool.connection_kwargs)
    client = redis.Redis(connection_pool=pool)
    conn = client.connection_pool.get_connection()
    real_send = conn.send_packed_command

    def counted(packed, *args, **kwargs):
        if sent is not None:
            sent.append(1)
        if before_send is not None:
            before_send()
        return real_send(packed, *args, **kwargs)

    conn.send_packed_command = counted
    try:
        yield FencedReader(conn, "g", "m-1", count)
    finally:
        client.connection_pool.release(conn)
        client.close()


def test_s11_paused_runtime_finishes_in_flight_then_reads_and_recovers_nothing(
    r, prefix, start_runtime
) -> None:
    """§11: paused, the runtime finishes and ACKs the message in progress, takes nothing new
    into its PEL (no read, no recovery of others' pending entries), still applies grants; after
    the resume it reads everything, in order."""
    shard, second = "s:1:0", "s:1:1"
    keys, keys2 = ShardKeys(shard, prefix), ShardKeys(second, prefix)
    release, started = threading.Event(), threading.Event()
    got: list[str] = []

    def handler(msg: Message) -> None:
        if msg.fields["n"] == "0":
            started.set()
            assert release.wait(10)
        got.append(f"{msg.shard}/{msg.fields['n']}")

    rt = start_runtime(handler, workers=1)
    rt.grant(make_grant(prefix, shard))
    wait_until(lambda: rt.status(shard) == "ACTIVE", what="shard active")
    r.xadd(keys.stream, {"key": "a", "n": "0"})
    assert started.wait(10)
    rt.set_paused(True)
    release.set()
    wait_until(
        lambda: rt.in_flight(shard) == 0 and pending(r, keys.stream) == 0,
        what="in-flight finished and ACKed",
    )
    for n in range(1, 6):
        r.xadd(keys.stream, {"key": "a", "n": str(n)})
    # Others' pending entries on a shard granted while paused: not claimed while paused.
    r.xgroup_create(keys2.stream, "g", id="0", mkstream=True)
    r.xadd(keys2.stream, {"key": "b", "n": "7"})
    r.xreadgroup("g", "old-owner", {keys2.stream: ">"}, count=1)
    rt.grant(make_grant(prefix, second))
    # The grant is applied (fence raised, group ready): the reader has run turns since the
    # entries were added, and read none of them.
    wait_until(lambda: rt.status(second) == "RECOVERING", what="grant applied while paused")
    assert got == [f"{shard}/0"]
    assert pending(r, keys.stream) == 0
    assert group_info(r, keys.stream)["last-delivered-id"] == r.xrange(keys.stream)[0][0]
    assert r.xpending(keys2.stream, "g")["consumers"] == [{"name": "old-owner", "pending": 1}]
    rt.set_paused(False)
    wait_until(lambda: len(got) == 7, what="everything read after the resume")
    assert [g for g in got if g.startswith(shard)] == [f"{shard}/{n}" for n in range(6)]
    assert f"{second}/7" in got


def test_i27_6_a_grant_interrupts_the_blocking_wait_without_client_unblock(
    r, prefix, start_runtime
) -> None:
    """The reader waits in XREAD BLOCK (10 s here); a control change shuts that socket down
    from this process (no CLIENT UNBLOCK, which a member role must not have): the new shard's
    entries are handled long before the block would have ended."""
    got: list[Message] = []
    rt = start_runtime(got.append, workers=1, block_ms=10_000)
    rt.grant(make_grant(prefix, "s:1:0"))
    wait_until(lambda: rt.reader._waiting_sock is not None, what="the reader blocked in its wait")
    r.xadd(ShardKeys("s:1:1", prefix).stream, {"key": "k", "n": "1"})
    started = time.monotonic()
    rt.grant(make_grant(prefix, "s:1:1"))
    wait_until(lambda: len(got) == 1, timeout=5.0, what="the new shard's entry handled")
    assert time.monotonic() - started < 5.0
    assert got[0].shard == "s:1:1"
    wait_until(lambda: rt.reader._waiting_sock is not None, what="waiting again, new connection")


def test_i25_fields_of_any_count_reach_the_handler_as_redis_returns_them(
    r, prefix, start_runtime
) -> None:
    """The dispatcher builds small field dicts on a fast path per field count (issue 25):
    every count, and a repeated name (the last value wins, as in redis-py), must come out as
    Redis stores them."""
    stream = ShardKeys("s:1:0", prefix).stream
    layouts = [
        ["key", "k1"],
        ["key", "k2", "a", "1"],
        ["a", "1", "key", "k3", "b", "2"],
        ["key", "k4", "a", "1", "b", "2", "c", "3"],
        ["key", "k5", "a", "1", "a", "2"],  # a repeated name
        ["a", "1", "b", "2"],  # no key field: keyed by its id
        ["key", "k6", "a", "1", "b", "2", "c", "3", "d", "4"],
    ]
    for fields in layouts:
        r.execute_command("XADD", stream, "*", *fields)
    expected = {msg_id: fields for msg_id, fields in r.xrange(stream)}
    seen: dict[str, dict[str, str]] = {}
    keys: dict[str, str] = {}
    lock = threading.Lock()

    def handler(msg: Message) -> None:
        with lock:
            seen[msg.id] = msg.fields
            keys[msg.id] = msg.key

    rt = start_runtime(handler, workers=2)
    rt.grant(make_grant(prefix, "s:1:0"))
    wait_until(lambda: len(seen) == len(layouts), what="all handled")
    assert seen == expected
    assert keys == {i: f.get("key", i) for i, f in expected.items()}
