"""Upgrades that cannot half-happen.

- `rota migrate` beside the previous releases' producer, loader and workers
  under load (rota_tools.bench.upgrade_loop), then the processes replaced
  one by one: migrate exits 0, every acknowledged task ran, none twice, no
  process logged an error. ROTA_UPGRADE_RUNS runs each (the closing note of
  issue 66 has 20 of each).
- A worker and a producer started on a database at an older schema say
  why they wait, and wait; once `rota migrate` has run, they run (and a
  loader with them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from rota import App, Settings
from rota.core.migrate import migrate
from rota.sql import migrations, schema_version
from rota_tools.bench.compare import checkout, repository_root
from rota_tools.bench.upgrade_loop import one_run
from tests.acceptance import workapp
from tests.acceptance.workapp import LOG_TABLE
from tests.helpers import shallow_clone, start_logged, wait_for

ROOT = Path(__file__).parent.parent.parent
# The previous release, and the commit before the one transaction of issue 66.
PREVIOUS = ("5cf3eb7", "f4fb12d")


@pytest.mark.skipif(shallow_clone(), reason="the earlier versions come from git history")
@pytest.mark.slow(reason="the previous release's pipeline under load, migrated, replaced")
@pytest.mark.parametrize("revision", PREVIOUS)
def test_migrate_under_load_breaks_nothing(revision: str, tmp_path: Path) -> None:
    runs = int(os.environ.get("ROTA_UPGRADE_RUNS", "1"))
    with checkout(repository_root(), revision, "old") as old:
        for _ in range(runs):
            report = one_run(old, revision, rate=150.0, seconds=3.0, keep=tmp_path)
            assert report["migrate"]["exit"] == 0, report["migrate"]
            assert report["acknowledged"] > 500, report
            assert report["lost"] == 0 and report["duplicates"] == 0, report
            assert report["drained"] and report["survived"], report
            assert report["errors"] == {}, report["errors"]


@pytest.mark.slow(reason="processes wait for a schema, then run")
def test_processes_on_an_older_schema_wait_and_say_why_then_run(
    empty_database_url: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        # Tables at the migration before the newest; no functions, no version.
        migrate(conn, target=migrations()[-1].version - 1)
        conn.execute(LOG_TABLE)
    env = {
        **os.environ,
        "ROTA_DATABASE_URL": empty_database_url,
        "ROTA_REDIS_URL": redis_url,
        "ROTA_POLL_SECONDS": "0.2",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tools'}",
    }
    env.pop("ROTA_DIRECT_DATABASE_URL", None)
    waits = (
        f"the database is at schema 0, this rota needs {schema_version().version}: run rota migrate"
    )
    worker = start_logged(
        [sys.executable, "-m", "rota", "worker", "--app", "tests.acceptance.workapp:app"], env=env
    )
    loader = start_logged(
        [sys.executable, "-m", "rota", "loader", "run", "--engine", "python"], env=env
    )
    with worker, loader:
        # A producer reads its tenants' backlog (backpressure): it waits too.
        producer = App(Settings(database_url=empty_database_url, redis_url=redis_url))
        producer.tasks.update(workapp.app.tasks)
        enqueued: list[Any] = []
        sending = threading.Thread(
            target=lambda: enqueued.append(producer.enqueue("sleep", (0.01,), tenant="a"))
        )
        sending.start()
        wait_for(lambda: waits in worker.errors() + worker.output(), 60, "the worker to say why")
        wait_for(lambda: waits in caplog.text, 60, "the producer to say why")
        assert worker.poll() is None and loader.poll() is None  # waiting, not crashed
        assert not enqueued
        done = subprocess.run(
            [sys.executable, "-m", "rota", "migrate"], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        sending.join(60)
        producer.close()
        (task_id,) = enqueued

        def ran() -> Any:
            with psycopg.connect(empty_database_url, autocommit=True) as conn:
                found = conn.execute("SELECT 1 FROM test_log WHERE task_id = %s", [task_id])
                return found.fetchone()

        wait_for(ran, 60, "the task to run once migrated")
        for process in (worker, loader):
            assert process.stop() == 0
            logged = process.errors() + process.output()
            assert "Traceback" not in logged, logged
        # Said once, not in a loop (the loader connects once there is
        # something to load: by then the schema may be in place).
        assert (worker.errors() + worker.output()).count(waits) == 1
