"""The Spark pipeline on a real standalone cluster (a master and two one-core
workers from the installed PySpark, on loopback): `rota loader run --master
spark://...` and `rota import --master spark://...` as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from rota import App, Settings, core
from rota.core import db
from rota_tools.devservers import SparkCluster, local_spark_cluster
from tests.acceptance.test_spark_crashes import loading_python_workers
from tests.helpers import spark_env, start_logged, wait_for

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow(reason="a standalone Spark cluster: a JVM per driver and executor, per run"),
]
Conn = psycopg.Connection[Any]


@pytest.fixture(scope="module")
def spark_cluster() -> Iterator[SparkCluster]:
    with local_spark_cluster(workers=2, cores=1) as cluster:
        yield cluster


def _stored(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM rota.tasks").fetchone()
    return int(row[0]) if row else 0


def _tasks_run_on_executors(cluster: SparkCluster) -> int:
    """Tasks the workers' executors finished, from their own logs."""
    return sum(log.read_text().count("Finished task") for log in cluster.executor_logs())


def _run_loader(
    cluster: SparkCluster,
    settings: Settings,
    checkpoint: Path,
    until: int,
    conn: Conn,
    during: Callable[[], None] = lambda: None,
) -> None:
    loader = start_logged(
        [
            *(sys.executable, "-m", "rota", "loader", "run", "--engine", "spark"),
            *("--master", cluster.url, "--checkpoint", str(checkpoint), "--trigger-seconds", "0.2"),
        ],
        env=spark_env(settings),
    )
    try:
        during()
        wait_for(lambda: _stored(conn) >= until, timeout=180, what=f"{until} tasks loaded")
    finally:
        loader.stop(signal.SIGTERM, timeout=60)  # killed if it has not stopped by then
    assert loader.returncode == 0, loader.errors()


def test_the_streaming_loader_on_a_cluster_loads_once_and_restarts_from_its_checkpoint(
    spark_cluster: SparkCluster, app: App, settings: Settings, conn: Conn, tmp_path: Path
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    before = _tasks_run_on_executors(spark_cluster)
    ids: list[UUID] = []
    for start in range(0, 40_000, 10_000):
        ids += app.enqueue_many(
            [
                parse_pdf.using(tenant=f"t{i % 100}").prepare(str(i))
                for i in range(start, start + 10_000)
            ]
        )
    checkpoint = tmp_path / "checkpoint"
    killed: list[tuple[int, Any]] = []

    def kill_a_loading_worker() -> None:
        # A Python worker of an executor, loading its shard: its Spark task
        # fails and is run again, and the shard loads once.
        workers = [w.pid for w in spark_cluster.workers]
        victims = wait_for(
            lambda: loading_python_workers(workers, int(conn.info.port)),
            timeout=120,
            what="an executor's Python worker loading a shard",
        )
        killed.append((victims[0], conn.execute("SELECT clock_timestamp()").fetchone()))
        os.kill(victims[0], signal.SIGKILL)

    _run_loader(spark_cluster, settings, checkpoint, 40_000, conn, kill_a_loading_worker)
    ids += app.enqueue_many(
        [parse_pdf.using(tenant="late").prepare(f"late{i}") for i in range(500)]
    )
    _run_loader(spark_cluster, settings, checkpoint, 40_500, conn)

    assert conn.execute("SELECT count(*), count(DISTINCT id) FROM rota.tasks").fetchone() == (
        40_500,
        40_500,
    )
    assert set(db.run(conn, core.task_states(ids))) == set(ids)
    # Each shard of each batch loaded once: the ledger's counts add up.
    assert conn.execute("SELECT sum(tasks) FROM rota.loader_batches").fetchone() == (40_500,)
    (_, (killed_at,)), *_ = killed
    later = conn.execute(
        "SELECT count(*) FROM rota.loader_batches WHERE batch_id = 0 AND loaded_at > %s",
        [killed_at],
    ).fetchone()
    assert later is not None and later[0] >= 1  # the killed worker's shard, run again
    # The buffer was read by tasks on the workers' executors, not the driver.
    assert _tasks_run_on_executors(spark_cluster) > before


def test_rota_import_on_a_cluster_loads_a_file_once(
    spark_cluster: SparkCluster, settings: Settings, conn: Conn, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 20_000
    path = tmp_path / "tasks.parquet"
    table = pa.table(
        {
            "name": ["app.parse"] * rows,
            "tenant": [f"t{i % 500}" for i in range(rows)],
            "args": [json.dumps([i]) for i in range(rows)],
        }
    )
    pq.write_table(table, path, row_group_size=2_000)  # several row groups: several tasks
    before = _tasks_run_on_executors(spark_cluster)
    command = [sys.executable, "-m", "rota", "import", str(path), "--master", spark_cluster.url]
    first = subprocess.run(
        command, env=spark_env(settings), capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["loaded"] == rows
    again = subprocess.run(
        command, env=spark_env(settings), capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stderr
    assert (json.loads(again.stdout)["loaded"], json.loads(again.stdout)["duplicates"]) == (0, rows)
    assert _stored(conn) == rows
    assert _tasks_run_on_executors(spark_cluster) > before
