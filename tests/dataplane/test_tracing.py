"""Issue 25.6: OpenTelemetry tracing from producer to handler, with the SDK's in-memory
exporter (opentelemetry-sdk is a dev dependency; the library needs only the API)."""

from __future__ import annotations

import threading

import pytest
from opentelemetry import trace

from dataplane import Consumer, Message, Producer
from dataplane.routing import ShardKeys
from tests.tracing_exporter import in_memory_exporter

from .conftest import routing_doc, version_doc, wait_until

EXPORTER = in_memory_exporter()


@pytest.fixture(autouse=True)
def clear() -> None:
    EXPORTER.clear()


def setup(coordinator, prefix: str) -> None:
    versions = [version_doc("orders", 1, 2, prefix)]
    coordinator.metadata = {
        "metadataEpoch": 1, "group": "g", "stream": "orders", "heartbeatIntervalMs": 100,
        "sessionTimeoutMs": 30000, "startPosition": "earliest", "keyPrefix": prefix,
        "versions": versions,
    }  # fmt: skip
    coordinator.routing = routing_doc("orders", prefix, *versions, write=1)


def test_i25_6_handler_span_continues_the_producers_trace(prefix, coordinator, redis_url):
    setup(coordinator, prefix)
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("checkout") as parent, Producer(
        coordinator.url, "orders", "k", redis_url=redis_url, tracing=True
    ) as p:
        sent = p.send("customer-7", {"amount": "12"})
    ctx = parent.get_span_context()
    got: list[Message] = []

    def handler(m: Message) -> None:
        got.append(m)
        if m.delivery_count == 1:
            raise ValueError("first try fails")

    c = Consumer(coordinator.url, "g", "k", handler, redis_url=redis_url, block_ms=100,
                 retry_backoff_ms=1, tracing=True)  # fmt: skip
    t = threading.Thread(target=c.run)
    t.start()
    try:
        wait_until(lambda: len(got) == 2, what="handled twice")
    finally:
        c.stop()
        t.join(15)
    assert got[0].fields["traceparent"].split("-")[1] == f"{ctx.trace_id:032x}"
    spans = [s for s in EXPORTER.get_finished_spans() if s.name == "rsc-dataplane handle"]
    assert len(spans) == 2
    for span, dc in zip(spans, (1, 2), strict=True):
        assert span.kind == trace.SpanKind.CONSUMER
        assert span.context.trace_id == ctx.trace_id
        assert span.parent is not None
        assert span.parent.span_id == ctx.span_id
        assert dict(span.attributes) == {
            "rsc.shard": sent.shard, "messaging.message.id": sent.id,
            "rsc.delivery_count": dc, "rsc.member_epoch": 1,
        }  # fmt: skip
    assert spans[0].status.status_code == trace.StatusCode.ERROR  # the raise is recorded
    assert spans[1].status.status_code != trace.StatusCode.ERROR


def test_i25_6_batch_handler_span_links_every_messages_context(prefix, coordinator, redis_url):
    setup(coordinator, prefix)
    tracer = trace.get_tracer("test")
    parents = []
    with Producer(coordinator.url, "orders", "k", redis_url=redis_url, tracing=True) as p:
        for i in range(3):
            with tracer.start_as_current_span(f"req-{i}") as sp:
                parents.append(sp.get_span_context())
                p.send("same-key", {"n": str(i)})
    got: list[Message] = []

    async def handler(msgs: list[Message]) -> None:
        got.extend(msgs)

    c = Consumer(coordinator.url, "g", "k", None, batch_handler=handler, redis_url=redis_url,
                 block_ms=100, tracing=True)  # fmt: skip
    t = threading.Thread(target=c.run)
    t.start()
    try:
        wait_until(lambda: len(got) == 3, what="handled")
    finally:
        c.stop()
        t.join(15)
    spans = [s for s in EXPORTER.get_finished_spans() if s.name == "rsc-dataplane handle_batch"]
    linked = {link.context.span_id for s in spans for link in s.links}
    assert linked == {pc.span_id for pc in parents}
    assert sum(s.attributes["messaging.batch.message_count"] for s in spans) == 3


def test_i25_6_producer_without_an_active_span_adds_no_fields(prefix, coordinator, redis_url, r):
    setup(coordinator, prefix)
    with Producer(coordinator.url, "orders", "k", redis_url=redis_url, tracing=True) as p:
        sent = p.send("k1", {"a": "1"})
    [(_id, fields)] = r.xrange(ShardKeys(sent.shard, prefix).stream)
    assert "traceparent" not in fields
