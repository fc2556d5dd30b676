"""One trace from a web process's request to the task's run in a worker,
through the Redis buffer and a loader, each its own process with an
OpenTelemetry SDK provider: the enqueue span is the request's child, the
loader's span links to it, the run span is the enqueue's child with the
task's queue, tenant, attempt and outcome, and a span the task makes is the
run's child (in the thread pool and in the process pool)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.test_workers import logged, start_worker, stop
from tests.helpers import start_logged, wait_for

ROOT = Path(__file__).parent.parent.parent
SITE = Path(__file__).parent / "tracing_site"


def _spans(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def _named(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [s for s in spans if s["name"] == name]
    return found


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_one_trace_from_a_web_request_to_the_run_through_buffer_and_loader(
    pool: str, env: dict[str, str], conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    traced = {
        **env,
        "PYTHONPATH": f"{SITE}:{ROOT}",
        "ROTA_TEST_SPANS": str(tmp_path),
    }
    loader = start_logged(
        [sys.executable, "-m", "rota", "loader", "run", "--engine", "python"],
        env={**traced, "ROTA_TEST_SERVICE": "loader"},
        cwd=ROOT,
    )
    worker = start_worker({**traced, "ROTA_TEST_SERVICE": "worker"}, "--pool", pool)
    try:
        web = subprocess.run(
            [sys.executable, "-m", "tests.acceptance.traced_web"],
            env={**env, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        first, *lines = web.stdout.splitlines()
        task_id = json.loads(first)["task"]
        web_spans = [json.loads(line) for line in lines]
        wait_for(lambda: logged(conn), what="the task to run")
        wait_for(
            lambda: any(s["name"] == "run traced_step" for s in _spans(tmp_path)),
            what="the run's span",
        )
    finally:
        stop(worker)
        stop(loader)
    spans = _spans(tmp_path)
    request, enqueue = _named(web_spans, "POST /reports"), _named(web_spans, "enqueue work")
    load = next(s for s in spans if s["name"] == "load" and s["links"])
    run, inside = _named(spans, "run traced_step"), _named(spans, "inside the task")
    trace_id = request["context"]["trace_id"]
    # The request is the root; the enqueue its child (a producer span).
    assert request["parent_id"] is None
    assert enqueue["context"]["trace_id"] == trace_id
    assert enqueue["parent_id"] == request["context"]["span_id"]
    assert enqueue["kind"] == "SpanKind.PRODUCER"
    assert enqueue["attributes"]["messaging.message.id"] == task_id
    # The loader's span, in the loader's process, links to the enqueue.
    assert load["resource"]["attributes"]["service.name"] == "loader"
    assert {
        (link["context"]["trace_id"], link["context"]["span_id"]) for link in load["links"]
    } == {(trace_id, enqueue["context"]["span_id"])}
    # The run, in the worker's process, is the enqueue's child, and a span the
    # task makes is the run's (in the process pool, made in the task's child).
    assert run["resource"]["attributes"]["service.name"] == "worker"
    assert run["context"]["trace_id"] == trace_id
    assert run["parent_id"] == enqueue["context"]["span_id"]
    assert run["kind"] == "SpanKind.CONSUMER"
    assert run["attributes"] == {
        "messaging.system": "rota",
        "messaging.destination.name": "work",
        "messaging.message.id": task_id,
        "rota.tenant": "traced",
        "rota.attempt": 1,
        "rota.outcome": "succeeded",
    }
    assert inside["context"]["trace_id"] == trace_id
    assert inside["parent_id"] == run["context"]["span_id"]
