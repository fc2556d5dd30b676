"""`rota bench import`: rows/s of `rota import` on a generated Parquet file,
against, in the same run, a plain Spark JDBC write of the same rows into a
bare table and a COPY of the same rows from one connection into a table with
rota.tasks' indexes (the one-connection ceiling), and the peak memory of the
Spark driver and of its Python workers."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
from psycopg import sql

from rota import Settings
from rota.core import db
from rota.core.copyrows import TASK_COPY_TYPES_LEAN, task_rows
from rota.loader.importer import import_tasks
from rota.loader.spark_session import SparkOptions, spark_session
from rota.model.envelope import TaskEnvelope
from rota_tools.bench.cpu import CpuMeter, median_run, pid_probe, postgres_probe, tree_probe
from rota_tools.bench.harness import reset
from rota_tools.devservers import descendants
from rota_tools.sql import query

JDBC_JAR = Path("/usr/share/java/postgresql.jar")  # Debian's libpostgresql-jdbc-java
PLAIN_TABLE = "bench_plain_import"  # dropped by the bench_drop_plain_import block
CEILING_TABLE = "bench_copy_ceiling"


def _jdbc(database_url: str) -> tuple[str, dict[str, str]]:
    """A libpq URL as a JDBC URL and its user and password."""
    parts = urlsplit(database_url)
    url = f"jdbc:postgresql://{parts.hostname}:{parts.port or 5432}{parts.path}"
    properties = {"user": unquote(parts.username or ""), "password": unquote(parts.password or "")}
    return f"{url}?reWriteBatchedInserts=true", properties


def _generate(spark: Any, rows: int, tenants: int, path: str) -> None:
    from pyspark.sql import functions as F

    frame = spark.range(rows).select(
        F.lit("app.parse").alias("name"),
        F.concat(F.lit("t"), (F.col("id") % tenants).cast("string")).alias("tenant"),
        F.to_json(F.array(F.col("id"))).alias("args"),
    )
    frame.write.mode("overwrite").parquet(path)


def _reset_peak_rss(pid: int) -> None:
    """Starts a process's VmHWM afresh (clear_refs 5), so that a peak is one
    phase's: the JDBC baseline runs in the same JVM."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _peak_rss_mb(pid: int) -> float | None:
    """A process's peak resident memory (VmHWM), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _python_workers(jvm: int) -> dict[str, Any]:
    """Peak RSS of the Python processes the JVM started (local mode: the
    executors' Python side), read while they live (workers are reused)."""
    peaks = [
        peak
        for pid in descendants(jvm)
        if "python" in _command(pid) and (peak := _peak_rss_mb(pid)) is not None
    ]
    return {
        "processes": len(peaks),
        "peak_rss_mb_max": max(peaks, default=None),
        "peak_rss_mb_sum": round(sum(peaks), 1),
        "note": "VmHWM of each; forked workers share the daemon's pages, so the sum overstates",
    }


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _ceiling_chunks(path: str, chunk: int, tenants: int) -> Iterator[list[tuple[Any, ...]]]:
    """The file's rows as `rota import` COPYs them (task_rows: tasks that
    keep the defaults, copy_tasks_lean's rows), `chunk` at a time."""
    import pyarrow.dataset as ds  # type: ignore[import-untyped]

    now = datetime.now(UTC)
    tenant_id = {f"t{i}": i + 1 for i in range(tenants)}
    numbered: list[tuple[int, TaskEnvelope]] = []
    columns = ["name", "tenant", "args"]
    for batch in ds.dataset(path, format="parquet").to_batches(columns=columns):
        data = batch.to_pydict()
        for name, tenant, args in zip(*(data[c] for c in columns), strict=True):
            payload = f'{{"args":{args},"kwargs":{{}}}}'
            envelope = TaskEnvelope(uuid.uuid4(), "default", tenant, name, payload, now)
            numbered.append((len(numbered) + 1, envelope))
            if len(numbered) == chunk:
                yield list(task_rows(numbered, {"default": 1}, tenant_id, now, lean=True))
                numbered = []
    if numbered:
        yield list(task_rows(numbered, {"default": 1}, tenant_id, now, lean=True))


def _copy_ceiling(settings: Settings, path: str, tenants: int) -> tuple[float, float | None]:
    """Rows/s of COPY from one connection into a table with rota.tasks'
    indexes, chunk by chunk (each its own transaction, as the loads), the
    rows built beforehand: only the COPY and its commit are timed; and
    PostgreSQL's CPU microseconds per row over those COPYs (None when the
    server is not on this machine)."""
    chunk = settings.loader_batch_size
    table = sql.Identifier(CEILING_TABLE)
    with db.connect(settings.database_url) as conn:
        conn.execute(sql.SQL(query("bench_copy_ceiling_setup")).format(table=table))
        copy_sql = sql.SQL(query("bench_copy_ceiling_copy")).format(table=table)
        server = postgres_probe(conn)
        rows, spent, server_cpu = 0, 0.0, 0.0
        try:
            for chunk_rows in _ceiling_chunks(path, chunk, tenants):
                cpu_before = server() if server else None
                started = time.perf_counter()
                _copy(conn, copy_sql, chunk_rows)
                spent += time.perf_counter() - started
                cpu_after = server() if server else None
                if cpu_before is not None and cpu_after is not None:
                    server_cpu += cpu_after - cpu_before
                rows += len(chunk_rows)
        finally:
            conn.execute(sql.SQL(query("bench_copy_ceiling_drop")).format(table=table))
    return rows / spent, (round(server_cpu / rows * 1e6, 2) if server else None)


def _copy(conn: psycopg.Connection[Any], statement: sql.Composed, rows: list[Any]) -> None:
    with conn.transaction(), conn.cursor(binary=True) as cur, cur.copy(statement) as copy:
        copy.set_types(TASK_COPY_TYPES_LEAN)
        for row in rows:
            copy.write_row(row)


def bench_import(
    settings: Settings, rows: int, tenants: int, runs: int, master: str
) -> dict[str, Any]:
    conf = {"spark.jars": str(JDBC_JAR)} if JDBC_JAR.exists() else {}
    spark = spark_session(master, "rota-bench-import", SparkOptions(conf))
    driver_pid = spark.sparkContext._gateway.proc.pid
    imported, plain, ceiling = [], [], []
    ceiling_cpu: list[float] = []
    import_cpu: list[dict[str, Any]] = []
    import_peaks: list[float] = []
    workers: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rota-bench-import-") as directory:
        path = str(Path(directory) / "tasks.parquet")
        _generate(spark, rows, tenants, path)
        url, properties = _jdbc(settings.database_url)
        for _ in range(runs):
            with db.connect(settings.database_url) as conn:
                reset(conn)
                meter = CpuMeter(
                    {
                        "spark": tree_probe(driver_pid),  # in local mode, the executors too
                        "driver_python": pid_probe(os.getpid()),
                        "postgresql": postgres_probe(conn),
                    }
                )
                _reset_peak_rss(driver_pid)
                meter.start()
                started = time.perf_counter()
                summary = import_tasks(settings, path, session=spark)
                elapsed = time.perf_counter() - started
                import_cpu.append(meter.report(elapsed, rows))
            imported.append(rows / elapsed)
            import_peaks.append(_peak_rss_mb(driver_pid) or 0.0)
            assert summary.loaded == rows, summary
            workers = _python_workers(driver_pid)  # while they live
            with db.connect(settings.database_url) as conn:
                reset(conn)
            rate, server_us = _copy_ceiling(settings, path, tenants)
            ceiling.append(rate)
            if server_us is not None:
                ceiling_cpu.append(server_us)
            if conf:
                started = time.perf_counter()
                spark.read.parquet(path).write.format("jdbc").options(
                    url=url, dbtable=PLAIN_TABLE, driver="org.postgresql.Driver", batchsize="10000"
                ).options(**properties).mode("overwrite").save()
                plain.append(rows / (time.perf_counter() - started))
        with db.connect(settings.database_url) as conn:
            conn.execute(query("bench_drop_plain_import"))
            reset(conn)
    driver_memory = spark.sparkContext.getConf().get("spark.driver.memory", "1g (default)")
    driver_peak = _peak_rss_mb(driver_pid)
    spark.stop()
    median = round(statistics.median(imported))
    cpu = median_run(import_cpu)
    per_row = {name: figures["us_per_task"] for name, figures in cpu["per_process"].items()}
    figures: dict[str, Any] = {
        "params": {
            "rows": rows,
            "tenants": tenants,
            "runs": runs,
            "master": master,
            "chunk": settings.loader_batch_size,
        },
        "import_rows_per_s": median,
        "runs": [round(r) for r in imported],
        "copy_ceiling_rows_per_s": round(statistics.median(ceiling)),
        "copy_ceiling_runs": [round(r) for r in ceiling],
        "import_to_copy_ceiling": round(median / statistics.median(ceiling), 3),
        # Where the import's CPU went (the median run by all processes' CPU
        # per row), and the rate those costs allow on this machine's cores:
        # the import cannot pass it without cutting a cost.
        "import_cpu_us_per_row": {**per_row, "all": cpu["all_us_per_task"]},
        "ceiling_postgresql_cpu_us_per_row": (
            statistics.median(ceiling_cpu) if ceiling_cpu else None
        ),
        "cpu_bound_rows_per_s": round((os.cpu_count() or 1) * 1e6 / cpu["all_us_per_task"]),
        "driver": {
            "memory_setting": driver_memory,
            # The import's own peak (reset before it), then the whole run's.
            "jvm_peak_rss_mb_import": statistics.median(import_peaks),
            "jvm_peak_rss_mb": driver_peak,
            "python_peak_rss_mb": _peak_rss_mb(os.getpid()),
        },
        "executors_python_workers": workers,
    }
    if plain:
        figures["plain_jdbc_rows_per_s"] = round(statistics.median(plain))
        figures["plain_jdbc_runs"] = [round(r) for r in plain]
        figures["import_to_jdbc"] = round(median / figures["plain_jdbc_rows_per_s"], 3)
    else:
        figures["plain_jdbc"] = f"not measured: {JDBC_JAR} is missing (libpostgresql-jdbc-java)"
    return figures
