"""`rota archive --before DATE --to URI`: a Spark job that writes the tasks
that succeeded, died or were cancelled to Parquet, partitioned by day and
queue, before retention removes them.

Each run takes the whole days from the previous run's bound (rota.archives)
to `before` (midnight UTC), one Spark partition per hour read by the
executors, and overwrites exactly those days' partitions, so a run that
failed part-way and runs again writes each task once; the ledger row commits
last. With ROTA_RETENTION_WAITS_FOR_ARCHIVE, retention keeps what no run has
written yet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from rota import core
from rota.core import connections, db
from rota.errors import ValidationError
from rota.loader.spark_progress import reporting
from rota.loader.spark_session import SparkOptions, spark_session
from rota.settings import Settings

COLUMNS = (
    ("task_id", "string"),
    ("status", "string"),  # succeeded, dead or cancelled
    ("queue", "string"),
    ("tenant", "string"),
    ("name", "string"),  # dead and cancelled tasks only: a success keeps its record alone
    ("payload", "string"),
    ("attempts", "int"),
    ("enqueued_at", "timestamp"),
    ("started_at", "timestamp"),
    ("finished_at", "timestamp"),
    ("last_error", "string"),
    ("result", "string"),  # a success's kept result, as JSON (NULL: none, or expired)
)
SLICE = timedelta(hours=1)  # one Spark partition: what one executor reads at once
# Progress: tasks read so far, slices read, slices in all (a slice's counts
# reach the driver when its Spark task ends).
OnProgress = Callable[[int, int, int], None]


@dataclass
class ArchiveSummary:
    since: str | None
    before: str
    location: str
    tasks: int
    days: list[str]


def day_bound(value: date | datetime) -> datetime:
    """Midnight UTC at or before `value`: runs archive whole days, so no
    two runs write the same day's partitions."""
    at = value if isinstance(value, datetime) else datetime(value.year, value.month, value.day)
    at = at if at.tzinfo else at.replace(tzinfo=UTC)
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _slices(first: datetime, last: datetime) -> list[tuple[datetime, datetime]]:
    start = first.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    slices = []
    while start <= last:
        slices.append((start, start + SLICE))
        start += SLICE
    return slices


def _read_slice(settings: Settings, bounds: tuple[datetime, datetime]) -> list[tuple[Any, ...]]:
    """On an executor: the tasks that ended in one slice."""
    with connections.connect(settings, "admin") as conn:
        return db.run(conn, core.archive_rows(*bounds))


def archive(
    settings: Settings,
    before: date | datetime,
    location: str,
    *,
    master: str = "local[*]",
    session: Any = None,
    options: SparkOptions | None = None,
    on_progress: OnProgress | None = None,
) -> ArchiveSummary:
    bound = day_bound(before)
    if bound > day_bound(datetime.now(UTC)):
        raise ValidationError(
            f"--before {bound.date()} is in the future: tasks may still end that day"
        )
    with connections.connect(settings, "admin") as conn:
        since = db.run(conn, core.archived_before())
        if since is not None and bound <= since:
            return ArchiveSummary(since.isoformat(), bound.isoformat(), location, 0, [])
        first, last = db.run(conn, core.archive_span(since, bound))
    tasks, days = 0, list[str]()
    if first is not None:
        tasks, days = _write(
            settings, _slices(first, last), location, master, session, options, on_progress
        )
    with connections.connect(settings, "admin") as conn:
        db.run(conn, core.record_archive(since, bound, location, tasks))
    return ArchiveSummary(
        since.isoformat() if since else None, bound.isoformat(), location, tasks, days
    )


def _write(
    settings: Settings,
    slices: list[tuple[datetime, datetime]],
    location: str,
    master: str,
    session: Any,
    options: SparkOptions | None,
    on_progress: OnProgress | None = None,
) -> tuple[int, list[str]]:
    from pyspark.sql import functions as F

    spark = session or spark_session(master, "rota-archive", options)
    schema = ", ".join(f"{name} {kind}" for name, kind in COLUMNS)
    # Counters the executors add to once per slice, for progress only (a
    # retried Spark task adds again); the summary counts what was written.
    read_tasks = spark.sparkContext.accumulator(0)
    read_slices = spark.sparkContext.accumulator(0)

    def read(bounds: tuple[datetime, datetime]) -> list[tuple[Any, ...]]:
        found = _read_slice(settings, bounds)
        read_tasks.add(len(found))
        read_slices.add(1)
        return found

    rows = spark.sparkContext.parallelize(slices, len(slices)).flatMap(read)
    frame = spark.createDataFrame(rows, schema).withColumn(
        "day", F.date_format(F.col("finished_at"), "yyyy-MM-dd")
    )

    def counted() -> tuple[int, int, int]:
        return (read_tasks.value, min(read_slices.value, len(slices)), len(slices))

    def report(now: tuple[int, int, int]) -> None:
        if on_progress is not None:
            on_progress(*now)

    with reporting(counted, report if on_progress else None):
        # Only the days written are replaced: earlier runs' days stay as they are.
        (
            frame.write.mode("overwrite")
            .option("partitionOverwriteMode", "dynamic")
            .partitionBy("day", "queue")
            .parquet(location)
        )
    days = sorted({start.strftime("%Y-%m-%d") for start, _ in slices})
    written = spark.read.parquet(location).where(F.col("day").isin(days))
    found = {r["day"]: r["count"] for r in written.groupBy("day").count().collect()}
    return sum(found.values()), sorted(str(day) for day in found)


def summary_dict(summary: ArchiveSummary) -> dict[str, Any]:
    return asdict(summary)
