"""On the PYTHONPATH of `rota bench end-to-end --tracing`'s traced runs:
every process (producer, loader, workers) gets an OpenTelemetry SDK tracer
provider with a batch span processor, as a production setup has, whose
exporter drops the spans (a collector's network cost is not rota's).
ROTA_BENCH_TRACING=sampled keeps one trace in ten (ParentBased of
TraceIdRatioBased, as high-volume services configure); any other value
keeps every span (the SDK's default)."""

from __future__ import annotations

import os

if os.environ.get("ROTA_BENCH_TRACING"):
    from collections.abc import Sequence

    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class _Dropped(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    _sampled = os.environ["ROTA_BENCH_TRACING"] == "sampled"
    _provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1)) if _sampled else None)
    _provider.add_span_processor(BatchSpanProcessor(_Dropped()))
    trace.set_tracer_provider(_provider)
