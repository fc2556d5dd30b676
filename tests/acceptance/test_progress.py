"""Progress of running tasks with a real worker: a task reporting a million
times costs the database about a write a second, and the app waiting on it
sees the values advance (sync, async and process-pool tasks); bad values are
refused to the task's code, never to its heartbeat; the last progress stays
after the task ends, shown by `rota task show`, the API and the console,
until retention drops it with the task's record."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from rota import App, Settings, core
from rota.consumer.progress import FLUSH_SECONDS
from rota.core import db
from rota.model.progress import MESSAGE_MAX
from tests.acceptance import progressapp
from tests.acceptance.progressapp import CALLS
from tests.acceptance.test_workers import stop
from tests.helpers import LoggedProcess, start_logged, wait_for
from tests.integration.test_dashboard import TOKEN, Console

ROOT = Path(__file__).parent.parent.parent


def start_worker(env: dict[str, str], *extra: str) -> LoggedProcess:
    command = [sys.executable, "-m", "rota", "worker", "--app", "tests.acceptance.progressapp:app"]
    return start_logged([*command, "--queues", "progress", *extra], env=env, cwd=ROOT)


@pytest.fixture
def producer(settings: Settings) -> Iterator[App]:
    application = App(settings)
    application.tasks.update(progressapp.app.tasks)
    yield application
    application.close()


def enqueue(producer: App, conn: psycopg.Connection[Any], name: str, *args: Any) -> Any:
    (task_id,) = producer.enqueue_many(
        [producer.tasks[name].using(tenant="acme").prepare(*args)], connection=conn
    )
    return task_id


def writes(conn: psycopg.Connection[Any], task_id: Any) -> int:
    """The times a worker stored the task's progress (rota.progress.writes)."""
    row = conn.execute("SELECT writes FROM rota.progress WHERE task_id = %s", [task_id]).fetchone()
    return 0 if row is None else int(row[0])


@pytest.mark.parametrize(
    ("task", "pool"),
    [("count", "threads"), ("count_async", "threads"), ("count", "processes")],
)
def test_a_million_reports_cost_a_write_a_second_and_the_waiting_app_sees_them_advance(
    env: dict[str, str],
    producer: App,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
    task: str,
    pool: str,
) -> None:
    go = tmp_path / "go"
    task_id = enqueue(producer, conn, task, str(go))
    worker = start_worker(env, "--pool", pool, "--concurrency", "1")
    try:
        result = producer.result(task_id)
        seen: list[float] = []

        def half_way() -> bool:
            progress = result.progress()
            if progress is not None and (not seen or seen[-1] != progress.done):
                seen.append(progress.done)
            return progress is not None and progress.done == CALLS // 2

        # Half-way the task waits for the go: what it reported so far is stored.
        wait_for(half_way, timeout=120, what="the progress half-way")
        go.touch()
        seconds = result.get(timeout=120)
        assert isinstance(seconds, float)
        final = wait_for(
            lambda: (p := result.progress()) is not None and p.done == CALLS and p,
            what="the last progress, after the task ended",
        )
    finally:
        stop(worker)
    seen.append(final.done)
    assert seen == sorted(set(seen)) and len(seen) >= 2, seen
    assert (final.total, final.message, final.fraction, final.attempt) == (CALLS, "done", 1.0, 1)
    # A write at most every FLUSH_SECONDS while it ran, and the last after its end.
    stored = writes(conn, task_id)
    assert 2 <= stored <= seconds / FLUSH_SECONDS + 2, (stored, seconds)


@pytest.fixture
def console(settings: Settings) -> Iterator[Console]:
    with Console(settings.model_copy(update={"dashboard_token": TOKEN})) as running:
        yield running


def test_bad_values_are_refused_to_the_task_and_what_is_kept_shows_everywhere(
    env: dict[str, str],
    producer: App,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
    console: Console,
) -> None:
    go = tmp_path / "go"
    task_id = enqueue(producer, conn, "refused", str(go))
    worker = start_worker(env, "--concurrency", "1")
    result = producer.result(task_id)
    try:
        progress = wait_for(result.progress, what="the task's progress")

        # Its heartbeat goes on: the lease is extended while it waits.
        def lease() -> Any:
            return conn.execute(
                "SELECT lease_expires_at FROM rota.running WHERE task_id = %s", [task_id]
            ).fetchone()

        first = wait_for(lease, what="the task to run")[0]
        wait_for(lambda: (row := lease()) is not None and row[0] > first, what="a heartbeat")

        assert (progress.done, progress.total, progress.fraction) == (2.0, 3.0, 2 / 3)
        assert progress.message == "x" * (MESSAGE_MAX - 1) + "…"

        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=console.url, headers=headers) as http:
            story = http.get(f"/api/tasks/{task_id}").json()
            assert story["where"] == "running"
            assert story["progress"]["done"] == 2.0 and story["progress"]["total"] == 3.0
            page = http.get(f"/tasks/{task_id}").text
            assert '<progress id="progress-bar" value="2.0" max="3.0">' in page
            assert "2 of 3 (66.7%)" in page
            running = http.get("/api/tasks", params={"state": "running"}).json()["tasks"]
            assert [t["progress"]["done"] for t in running] == [2.0]
            listing = http.get("/tasks", params={"state": "running"}).text
            assert '<progress value="2.0" max="3.0"></progress> 67%' in listing

        go.touch()
        errors = result.get(timeout=60)
    finally:
        stop(worker)

    # Each bad report raised ValidationError in the task, which went on.
    assert isinstance(errors, list) and len(errors) == 7
    assert all(error.startswith("progress: ") for error in errors), errors
    kept = result.progress()
    assert kept is not None and (kept.done, kept.total) == (2.0, 3.0)
    assert asyncio.run(result.aprogress()) == kept

    shown = subprocess.run(
        [sys.executable, "-m", "rota", "task", "show", str(task_id), "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(shown.stdout)["progress"]["done"] == 2.0
    text = subprocess.run(
        [sys.executable, "-m", "rota", "task", "show", str(task_id)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "progress 2 of 3 (66.7%): xxx" in text

    # Retention drops the progress with the task's record.
    assert db.run(conn, core.prune_finished(0)) >= 1
    assert result.progress() is None


def test_a_dead_task_keeps_its_last_progress_until_retention_drops_it(
    env: dict[str, str], producer: App, conn: psycopg.Connection[Any]
) -> None:
    task_id = enqueue(producer, conn, "fails_after_progress")
    worker = start_worker(env, "--concurrency", "1")
    result = producer.result(task_id)
    try:
        wait_for(lambda: result.status() == "dead", what="the task to die")
        kept = wait_for(result.progress, what="its last progress, stored after its end")
    finally:
        stop(worker)
    assert (kept.done, kept.total, kept.fraction) == (7.0, None, None)
    assert kept.message == "half-way, then it fails"
    assert db.run(conn, core.prune_dead(0)) == 1
    assert result.progress() is None
