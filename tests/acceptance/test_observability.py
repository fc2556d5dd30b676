"""A running worker's and loader's metrics and health, scraped over HTTP and
parsed with prometheus_client's parser; their logs with --log-format json."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from rota import App
from rota_tools.devservers import free_port
from tests.acceptance.test_workers import enqueue
from tests.helpers import start_logged, wait_for

ROOT = Path(__file__).parent.parent.parent


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def answers(port: int, path: str) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}").status_code
    except httpx.TransportError:
        return None


def test_a_worker_counts_what_it_runs_and_says_when_it_is_ready(
    env: dict[str, str], producer: App, conn: psycopg.Connection[Any]
) -> None:
    port = free_port()
    worker = start_logged(
        [
            sys.executable,
            "-m",
            "rota",
            "worker",
            "--app",
            "tests.acceptance.workapp:app",
            "--queues",
            "work",
            "--metrics-port",
            str(port),
            "--log-format",
            "json",
        ],
        env=env,
        cwd=ROOT,
    )
    try:
        wait_for(lambda: answers(port, "/readyz") == 200, what="the worker to be ready")
        assert answers(port, "/healthz") == 200
        calls = [producer.tasks["sleep"].using(tenant="a").prepare(0) for _ in range(5)]
        calls += [producer.tasks["boom"].using(tenant="b").prepare()]  # 2 attempts, then dead
        enqueue(conn, producer, calls)

        def done() -> bool:
            m = scrape(port)
            return m.get(("rota_tasks_dead_total", (("queue", "work"),)), 0) == 1

        wait_for(done, what="the work to be done")
        m = scrape(port)
        assert m[("rota_tasks_claimed_total", (("queue", "work"),))] == 7
        assert m[("rota_tasks_completed_total", (("queue", "work"), ("tenant", "a")))] == 5
        assert m[("rota_tasks_failed_total", (("queue", "work"), ("tenant", "b")))] == 2
        assert m[("rota_tasks_retried_total", (("queue", "work"),))] == 1
        assert m[("rota_task_run_seconds_count", (("queue", "work"),))] == 7
        assert m[("rota_task_wait_seconds_count", (("queue", "work"),))] == 7
        assert ("process_cpu_seconds_total", ()) in m
    finally:
        worker.stop()  # SIGTERM; killed if it has not stopped within 30 s
    lines = [json.loads(line) for line in worker.errors().splitlines() if line.startswith("{")]
    failures = [x for x in lines if "failed on attempt" in x["message"]]
    assert len(failures) == 2 and all("Traceback" in x["message"] for x in failures)
    assert any(x["level"] == "warning" and "is dead" in x["message"] for x in lines)


def test_a_loader_counts_its_passes(env: dict[str, str], producer: App) -> None:
    env = {**env, "ROTA_SHARDS": str(producer.settings.shards)}
    port = free_port()
    loader = start_logged(
        [
            sys.executable,
            "-m",
            "rota",
            "loader",
            "run",
            "--engine",
            "python",
            "--metrics-port",
            str(port),
        ],
        env=env,
        cwd=ROOT,
    )
    try:
        wait_for(lambda: answers(port, "/healthz") == 200, what="the loader to listen")
        producer.enqueue_many(
            [producer.tasks["sleep"].using(tenant=f"t{i}").prepare(0) for i in range(40)]
        )
        wait_for(
            lambda: scrape(port).get(("rota_loader_tasks_total", (("outcome", "loaded"),))) == 40,
            what="the tasks to load",
        )
        assert answers(port, "/readyz") == 200
        assert scrape(port)[("rota_loader_passes_total", ())] >= 1
    finally:
        loader.stop()  # SIGTERM; killed if it has not stopped within 30 s
    log = loader.errors()
    assert "reading 4 shard(s) of rota:buffer" in log
    assert sum(int(n) for n in re.findall(r"loaded (\d+) task\(s\)", log)) == 40
