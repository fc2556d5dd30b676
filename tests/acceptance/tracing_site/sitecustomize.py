"""Imported at start-up by the processes tests/acceptance/test_tracing.py
starts (on their PYTHONPATH): with ROTA_TEST_SPANS set, an OpenTelemetry SDK
tracer provider whose exporter appends each finished span, as one JSON line,
to a file of the process's own under that directory."""

from __future__ import annotations

import os

if os.environ.get("ROTA_TEST_SPANS"):
    from collections.abc import Sequence

    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class _LinesExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            path = os.path.join(os.environ["ROTA_TEST_SPANS"], f"{os.getpid()}.jsonl")
            with open(path, "a") as out:
                for span in spans:
                    out.write(span.to_json(indent=None) + "\n")
            return SpanExportResult.SUCCESS

    _provider = TracerProvider(
        resource=Resource.create({"service.name": os.environ.get("ROTA_TEST_SERVICE", "rota")})
    )
    _provider.add_span_processor(SimpleSpanProcessor(_LinesExporter()))
    trace.set_tracer_provider(_provider)
