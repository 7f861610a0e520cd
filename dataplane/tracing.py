"""OpenTelemetry tracing (optional: ``pip install 'rsc-dataplane[tracing]'``, i.e.
opentelemetry-api; the application installs and configures the SDK and an exporter).

Only imported when a Producer or Consumer is built with ``tracing=True``: otherwise the
library never imports ``opentelemetry`` and nothing changes on the message path.

- Producer: the current trace context goes into each message's fields (W3C ``traceparent``,
  and ``tracestate`` when there is one), one injection per ``send_many`` call.
- Consumer: each handler call runs in a CONSUMER span that continues the message's context
  (its parent is the producer's span), named ``rsc-dataplane handle``, with the attributes
  ``rsc.shard``, ``messaging.message.id``, ``rsc.delivery_count`` and ``rsc.member_epoch``;
  a raise is recorded on the span. A batch handler's call runs in one span
  ``rsc-dataplane handle_batch`` with ``rsc.shard``, ``messaging.batch.message_count`` and
  ``rsc.member_epoch``, linked to each message's context.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from opentelemetry import propagate, trace

from . import __version__

TRACER = trace.get_tracer("rsc-dataplane", __version__)
FIELDS = ("traceparent", "tracestate")


def current_context_fields() -> dict[str, str]:
    """The current trace context as message fields (empty without an active span)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k in FIELDS}


def _attributes(msg: Any, epoch: int) -> dict[str, Any]:
    return {
        "rsc.shard": msg.shard,
        "messaging.message.id": msg.id,
        "rsc.delivery_count": msg.delivery_count,
        "rsc.member_epoch": epoch,
    }


def _batch_span_args(msgs: list[Any], epoch: int) -> dict[str, Any]:
    links = []
    for m in msgs:
        sc = trace.get_current_span(propagate.extract(m.fields)).get_span_context()
        if sc.is_valid:
            links.append(trace.Link(sc))
    attrs = {
        "rsc.shard": msgs[0].shard if msgs else "",
        "messaging.batch.message_count": len(msgs),
        "rsc.member_epoch": epoch,
    }
    return {"links": links, "attributes": attrs, "kind": trace.SpanKind.CONSUMER}


def wrap(handler: Callable[..., Any], *, batch: bool, epoch: Callable[[], int]) -> Any:
    """The handler, each call in a span continuing the message's trace context."""
    is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004
    )
    kind = trace.SpanKind.CONSUMER
    if batch:
        if is_async:

            @functools.wraps(handler)
            async def batch_async(msgs: list[Any]) -> Any:
                args = _batch_span_args(msgs, epoch())
                with TRACER.start_as_current_span("rsc-dataplane handle_batch", **args):
                    return await handler(msgs)

            return batch_async

        @functools.wraps(handler)
        def batch_sync(msgs: list[Any]) -> Any:
            with TRACER.start_as_current_span("rsc-dataplane handle_batch",
                                              **_batch_span_args(msgs, epoch())):  # fmt: skip
                return handler(msgs)

        return batch_sync
    if is_async:

        @functools.wraps(handler)
        async def one_async(msg: Any) -> Any:
            with TRACER.start_as_current_span(
                "rsc-dataplane handle", context=propagate.extract(msg.fields), kind=kind,
                attributes=_attributes(msg, epoch()),
            ):  # fmt: skip
                return await handler(msg)

        return one_async

    @functools.wraps(handler)
    def one(msg: Any) -> Any:
        with TRACER.start_as_current_span(
            "rsc-dataplane handle", context=propagate.extract(msg.fields), kind=kind,
            attributes=_attributes(msg, epoch()),
        ):  # fmt: skip
            return handler(msg)

    return one


__all__ = ["FIELDS", "current_context_fields", "wrap"]
