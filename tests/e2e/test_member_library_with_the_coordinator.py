"""Issues 25.2, 25.3, 25.6 and 25.7 against the REAL coordinator (gunicorn on PostgreSQL), not
the data-plane tests' stand-in: one member with a batch handler, its metrics port and tracing
on, consuming what a traced producer sent. Batches are one shard's, in ID order, within
``batch_size``; ``/metrics``, ``/healthz`` and ``status()`` say what the coordinator says; each
batch's span links the producer's trace and carries the member epoch the coordinator gave;
the coordinator's describe names the member's library and version."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest
from opentelemetry import trace

import dataplane
from dataplane import Consumer, Message, Producer
from tests.member_http import get, total
from tests.tracing_exporter import in_memory_exporter

from .conftest import World

pytestmark = [
    pytest.mark.needs_postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "liveness"]),
]

EXPORTER = in_memory_exporter()
BATCH = 20


def test_i25_2_3_6_7_batches_metrics_status_and_traces_of_a_member_with_the_real_coordinator(
    world: World,
) -> None:
    world.create(2, heartbeat_interval_ms=250, session_timeout_ms=10_000)
    shards = set(world.shard_ids())
    tracer = trace.get_tracer("e2e")
    with tracer.start_as_current_span("checkout") as checkout, Producer(
        world.server.url, world.stream, world.stream_key, redis_url=world.redis_url, tracing=True
    ) as producer:
        sent = producer.send_many([(f"k{i % 13}", {"n": str(i)}) for i in range(300)])
    trace_id = checkout.get_span_context().trace_id

    lock = threading.Lock()
    batches: list[list[Message]] = []

    def handle(msgs: list[Message]) -> None:
        with lock:
            batches.append(list(msgs))

    EXPORTER.clear()
    consumer = Consumer(
        world.server.url, world.group, world.group_key, None, batch_handler=handle,
        redis_url=world.redis_url, member_id="m-batch", block_ms=100, batch_size=BATCH,
        metrics_port=0, tracing=True,
    )  # fmt: skip
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        world.wait(lambda: sum(len(b) for b in batches) >= 300, 60, "300 messages handled")
        world.wait(lambda: world.stable_with({"m-batch"}), 30, "m-batch owning both shards")
        epoch = next(m for m in world.describe()["members"] if m["memberId"] == "m-batch")["memberEpoch"]

        # 25.2: each batch one shard's, in ID order, never more than batch_size; each key's
        # messages in ID order across batches (batches of a shard's lanes may interleave);
        # every message once.
        def order(entry_id: str) -> tuple[int, ...]:
            return tuple(map(int, entry_id.split("-")))

        per_key: dict[str, list[str]] = defaultdict(list)
        for b in batches:
            assert 1 <= len(b) <= BATCH
            assert len({m.shard for m in b}) == 1
            assert [m.id for m in b] == sorted((m.id for m in b), key=order)
            for m in b:
                per_key[m.key].append(m.id)
        for ids in per_key.values():
            assert ids == sorted(ids, key=order)
        assert sorted((m.shard, m.id) for b in batches for m in b) == sorted(
            (s.shard, s.id) for s in sent
        )

        # 25.3: the metrics port and status() agree with the coordinator.
        port = consumer.metrics_port
        assert total(port, "rsc_member_messages_handled_total") == 300
        assert total(port, "rsc_member_owned_shards") == 2
        assert get(port, "/healthz")[0] == 200
        st = consumer.status()
        assert (st.member_id, st.member_epoch, set(st.owned_shards)) == ("m-batch", epoch, shards)
        assert st.in_flight == 0
        assert st.last_error is None

        # 25.6: every batch ran in a span linked to the checkout's trace, with the member epoch.
        spans = [s for s in EXPORTER.get_finished_spans() if s.name == "rsc-dataplane handle_batch"]
        assert len(spans) == len(batches)
        assert sum(s.attributes["messaging.batch.message_count"] for s in spans) == 300
        assert {s.attributes["rsc.member_epoch"] for s in spans} == {epoch}
        assert all(link.context.trace_id == trace_id for s in spans for link in s.links)
        assert sum(len(s.links) for s in spans) == 300

        # 25.7: the coordinator names the member's library and version.
        member = next(m for m in world.describe()["members"] if m["memberId"] == "m-batch")
        assert member["libraryVersion"] == f"rsc-dataplane/{dataplane.__version__}"
    finally:
        consumer.stop()
        thread.join(30)
    assert not thread.is_alive()
