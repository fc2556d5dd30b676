"""rota.runtime.tracing without a process's global provider touched: each
case runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rota.errors import ValidationError
from rota.model.envelope import check_payload

ROOT = Path(__file__).parent.parent.parent


def _python(*parts: str) -> str:
    """Runs the parts, each dedented, as one program; returns what it printed."""
    done = subprocess.run(
        [sys.executable, "-c", "\n".join(textwrap.dedent(part) for part in parts)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "ROTA_DATABASE_URL": "postgresql://u@127.0.0.1/x"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


BATCH = """
from rota.buffer.entries import TaskBatch
from rota.model.envelope import envelope_template
from rota.runtime import tracing
batch = TaskBatch.empty()
batch.add(envelope_template("t", "q"), "alice", [1], {})
batch.add(envelope_template("t", "q"), "alice", ["x" * 150], {})
"""


def test_a_traced_payload_is_valid_and_nothing_else_is_added() -> None:
    parent = f"00-{'a' * 32}-{'b' * 16}-01"
    traced = '{"args":[],"kwargs":{},"trace":{"traceparent":"' + parent + '"}}'
    check_payload(traced, 1024)
    for bad in (
        '{"args":[],"kwargs":{},"trace":"00-x"}',
        '{"args":[],"kwargs":{},"trace":{"traceparent":1}}',
        '{"args":[],"kwargs":{},"other":{}}',
    ):
        with pytest.raises(ValidationError, match=r"'trace' \(an object of strings\)"):
            check_payload(bad, 1024)


def test_without_opentelemetry_nothing_is_imported_and_nothing_changes() -> None:
    out = _python(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if rota[otel] were not installed
        """,
        BATCH,
        """
        with tracing.enqueue(batch, 1024):
            pass
        loaded = [m for m, v in sys.modules.items() if "opentelemetry" in m and v is not None]
        print(batch.payloads, tracing.current(), loaded)
        """,
    )
    assert out == """['{"args":[1],"kwargs":{}}', '{"args":["%s"],"kwargs":{}}'] None []""" % (
        "x" * 150
    )


def test_installed_without_a_provider_adds_no_trace() -> None:
    out = _python(BATCH, "with tracing.enqueue(batch, 1024):\n    pass\nprint(batch.payloads)")
    assert "trace" not in out


def test_with_a_provider_each_payload_carries_the_enqueue_span_within_the_cap() -> None:
    out = _python(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        """,
        BATCH,
        """
        import json
        from rota.model.envelope import check_payload
        with tracing.enqueue(batch, 200):  # the second task's trace would pass 200 bytes
            pass
        (span,) = exporter.get_finished_spans()
        first = json.loads(batch.payloads[0])
        check_payload(batch.payloads[0], 200)
        assert first["trace"]["traceparent"].split("-")[2] == format(span.context.span_id, "016x")
        assert "trace" not in batch.payloads[1]
        print(span.name, span.kind, dict(span.attributes))
        """,
    )
    assert out == (
        "enqueue q SpanKind.PRODUCER {'messaging.system': 'rota', 'rota.tasks': 2, "
        "'messaging.destination.name': 'q', 'rota.tenant': 'alice'}"
    )


def test_a_runs_outcome_is_on_its_span() -> None:
    out = _python(
        """
        import asyncio, datetime, uuid
        import rota
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from rota.core import ClaimedTask
        from rota.runtime import tracing
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        now = datetime.datetime.now(datetime.UTC)
        task = ClaimedTask(uuid.uuid4(), "t", {"args": [], "kwargs": {}}, "q", "a", 2, 3, now, now)
        for error in (None, rota.Retry(), rota.Cancelled(), asyncio.CancelledError(), KeyError()):
            try:
                with tracing.run(task):
                    if error is not None:
                        raise error
            except BaseException:
                pass
        print([
            (s.attributes["rota.outcome"], s.status.status_code.name, s.parent is None)
            for s in exporter.get_finished_spans()
        ])
        """
    )
    assert out == (
        "[('succeeded', 'UNSET', True), ('retry', 'UNSET', True), ('cancelled', 'UNSET', True),"
        " ('cancelled', 'UNSET', True), ('failed', 'ERROR', True)]"
    )
