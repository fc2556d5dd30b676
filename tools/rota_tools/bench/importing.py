"""`rota bench import`: rows/s of `rota import` on a generated Parquet file,
against a plain Spark JDBC write of the same rows into a bare table in the
same run, and the Spark driver's peak memory."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from rota import Settings
from rota.core import db
from rota.loader.importer import import_tasks
from rota.loader.spark_session import SparkOptions, spark_session
from rota_tools.bench.core import reset
from rota_tools.sql import query

JDBC_JAR = Path("/usr/share/java/postgresql.jar")  # Debian's libpostgresql-jdbc-java
PLAIN_TABLE = "bench_plain_import"  # dropped by the bench_drop_plain_import block


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


def _peak_rss_mb(pid: int) -> float | None:
    """A process's peak resident memory (VmHWM), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def bench_import(
    settings: Settings, rows: int, tenants: int, runs: int, master: str
) -> dict[str, Any]:
    conf = {"spark.jars": str(JDBC_JAR)} if JDBC_JAR.exists() else {}
    spark = spark_session(master, "rota-bench-import", SparkOptions(conf))
    driver_pid = spark.sparkContext._gateway.proc.pid
    imported, plain = [], []
    with tempfile.TemporaryDirectory(prefix="rota-bench-import-") as directory:
        path = str(Path(directory) / "tasks.parquet")
        _generate(spark, rows, tenants, path)
        url, properties = _jdbc(settings.database_url)
        for _ in range(runs):
            with db.connect(settings.database_url) as conn:
                reset(conn)
            started = time.perf_counter()
            summary = import_tasks(settings, path, session=spark)
            imported.append(rows / (time.perf_counter() - started))
            assert summary.loaded == rows, summary
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
    spark.stop()
    figures: dict[str, Any] = {
        "params": {"rows": rows, "tenants": tenants, "runs": runs, "master": master},
        "import_rows_per_s": round(statistics.median(imported)),
        "runs": [round(r) for r in imported],
        "driver": {"memory_setting": driver_memory, "jvm_peak_rss_mb": _peak_rss_mb(driver_pid)},
    }
    if plain:
        figures["plain_jdbc_rows_per_s"] = round(statistics.median(plain))
        figures["plain_jdbc_runs"] = [round(r) for r in plain]
        figures["ratio_to_plain_jdbc"] = round(
            figures["import_rows_per_s"] / figures["plain_jdbc_rows_per_s"], 3
        )
    else:
        figures["plain_jdbc"] = f"not measured: {JDBC_JAR} is missing (libpostgresql-jdbc-java)"
    return figures
