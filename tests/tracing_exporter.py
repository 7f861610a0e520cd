"""An in-memory span exporter on the process's one SDK TracerProvider.

OpenTelemetry accepts one global provider per process and ignores a second
``set_tracer_provider``; tests of the data plane and the end-to-end tests may share an xdist
worker, so each adds its own exporter to whichever SDK provider is already there."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def in_memory_exporter() -> InMemorySpanExporter:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter
