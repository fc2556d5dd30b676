"""OpenTelemetry, with `rota[otel]` installed and a tracer provider configured.

The W3C trace context of the code that enqueues travels in each task's
payload (`"trace": {"traceparent": ...}`), through the buffer, the loader
and PostgreSQL, to the worker. Spans: `enqueue <queue>` (producer) around
storing a batch, `load` (loader) per load, linked to the contexts of the
tasks it loads, and `run <task>` (worker), a child of the enqueue's context,
current while the task runs. Without the package nothing is imported, and
without a provider each call costs one check.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from rota.buffer.entries import TaskBatch
    from rota.core import ClaimedTask

# A payload is a JSON object; its trace goes in before its closing brace.
TRACE_KEY = "trace"
_TRACEPARENT_AT = '"traceparent":"'  # then 55 characters: version-trace-span-flags
# A load links to this many of its tasks' traces at most (the SDK's default cap).
MAX_LINKS = 128
_NOTHING = contextlib.nullcontext()

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError:  # rota[otel] is not installed
    trace = None  # type: ignore[assignment]


_made: tuple[Any, Any] = (None, None)  # (provider, its tracer for rota)


def _tracer() -> Any:
    """rota's tracer, or None while no provider is configured."""
    global _made
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if provider is _made[0]:
        return _made[1]
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    from importlib.metadata import version

    _made = (provider, provider.get_tracer("rota", version("rota")))
    return _made[1]


def enqueue(batch: TaskBatch, max_payload_bytes: int) -> contextlib.AbstractContextManager[Any]:
    """A span around storing `batch`, whose context each task carries."""
    tracer = _tracer()
    if tracer is None or not len(batch):
        return _NOTHING
    return _enqueue(tracer, batch, max_payload_bytes)


@contextlib.contextmanager
def _enqueue(tracer: Any, batch: TaskBatch, max_payload_bytes: int) -> Iterator[None]:
    queues = {t.queue for t in batch.templates}
    attributes: dict[str, Any] = {"messaging.system": "rota", "rota.tasks": len(batch)}
    if len(queues) == 1:
        attributes["messaging.destination.name"] = next(iter(queues))
    if len(set(batch.tenants)) == 1:
        attributes["rota.tenant"] = batch.tenants[0]
    if len(batch) == 1:
        attributes["messaging.message.id"] = str(batch.ids[0])
    name = f"enqueue {attributes.get('messaging.destination.name', 'tasks')}"
    with tracer.start_as_current_span(name, kind=trace.SpanKind.PRODUCER, attributes=attributes):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if carrier:
            # Tracing never refuses a task: one that the trace would put over
            # the payload cap goes without it.
            suffix = f',"{TRACE_KEY}":{orjson.dumps(carrier).decode()}}}'
            batch.payloads = [
                p[:-1] + suffix if len(p) + len(suffix) <= max_payload_bytes else p
                for p in batch.payloads
            ]
        yield


def load(count: int, payloads: Iterable[str]) -> contextlib.AbstractContextManager[Any]:
    """A span around loading `count` tasks, linked to the traces they carry."""
    tracer = _tracer()
    if tracer is None:
        return _NOTHING
    links: list[Any] = []
    seen: set[str] = set()
    for payload in payloads:
        if len(links) >= MAX_LINKS:
            break
        at = payload.find(_TRACEPARENT_AT)
        if at < 0:
            continue
        traceparent = payload[at + len(_TRACEPARENT_AT) : at + len(_TRACEPARENT_AT) + 55]
        if traceparent not in seen:
            seen.add(traceparent)
            parent = propagate.extract({"traceparent": traceparent})
            context = trace.get_current_span(parent).get_span_context()
            if context.is_valid:
                links.append(trace.Link(context))
    return tracer.start_as_current_span(  # type: ignore[no-any-return]
        "load",
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes={"messaging.system": "rota", "rota.tasks": count},
    )


def run(task: ClaimedTask) -> contextlib.AbstractContextManager[Any]:
    """A span around one run of `task`, a child of its enqueue's context."""
    tracer = _tracer()
    if tracer is None:
        return _NOTHING
    return _Run(tracer, task)


class _Run:
    """The run span, current while the task runs (a class, not a generator:
    this is paid once per task)."""

    __slots__ = ("span", "token")

    def __init__(self, tracer: Any, task: ClaimedTask) -> None:
        span = self.span = tracer.start_span(
            f"run {task.name}",
            context=_parent(task.payload.get(TRACE_KEY)),
            kind=trace.SpanKind.CONSUMER,
            record_exception=False,
            set_status_on_exception=False,
        )
        if span.is_recording():  # not sampled out: worth describing
            span.set_attributes(
                {
                    "messaging.system": "rota",
                    "messaging.destination.name": task.queue,
                    "messaging.message.id": str(task.id),
                    "rota.tenant": task.tenant,
                    "rota.attempt": task.attempt,
                }
            )

    def __enter__(self) -> None:
        self.token = otel_context.attach(trace.set_span_in_context(self.span))

    def __exit__(self, _type: Any, error: BaseException | None, _tb: Any) -> None:
        from rota.errors import Cancelled, Retry

        otel_context.detach(self.token)
        span = self.span
        if not span.is_recording():
            pass
        elif error is None:
            span.set_attribute("rota.outcome", "succeeded")
        elif isinstance(error, Retry):
            span.set_attribute("rota.outcome", "retry")
        elif isinstance(error, Cancelled | asyncio.CancelledError):
            span.set_attribute("rota.outcome", "cancelled")
        else:
            span.set_attribute("rota.outcome", "failed")
            span.record_exception(error)
            span.set_status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}")
        span.end()


_last_parent: tuple[Any, Any] = (None, None)  # (carrier, its context): a batch's tasks share one


def _parent(carrier: Any) -> Any:
    global _last_parent
    if not isinstance(carrier, dict):
        return None
    if carrier == _last_parent[0]:
        return _last_parent[1]
    parent = propagate.extract(carrier)
    _last_parent = (carrier, parent)
    return parent


def current() -> dict[str, str] | None:
    """The current trace context as a carrier (for a child process), if any."""
    if trace is None:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


def attach(carrier: dict[str, str] | None) -> None:
    """Makes `carrier` the current context (a child process's task, run in
    a context of its own)."""
    if trace is not None and carrier:
        otel_context.attach(propagate.extract(carrier))
