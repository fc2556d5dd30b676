"""A web process for tests/acceptance/test_tracing.py: handles one request
(a span) that enqueues a task through the Redis buffer, with an in-memory
exporter; prints the task's id, then each finished span as a JSON line."""

from __future__ import annotations

import json

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider(resource=Resource.create({"service.name": "web"}))
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

from tests.acceptance.workapp import app, traced_step  # noqa: E402 - after the provider

with trace.get_tracer("web").start_as_current_span("POST /reports"):
    task_id = traced_step.using(tenant="traced").enqueue()
app.close()
print(json.dumps({"task": str(task_id)}))
for span in exporter.get_finished_spans():
    print(span.to_json(indent=None))
