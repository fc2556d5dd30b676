"""`rota archive`: ended tasks to Parquet by day and queue, each once, and
retention that waits for it (Spark in local mode, real PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from rota import App, Settings, core
from rota.consumer.maintenance import Maintenance, TickResult
from rota.core import db
from rota.core.results import KeptResult, complete_keeping
from rota.loader.archive import archive

pytestmark = pytest.mark.spark
Conn = psycopg.Connection[Any]
TODAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
DAY_1, DAY_2, DAY_3 = (TODAY - timedelta(days=n) for n in (3, 2, 1))


def _ended(app: App, conn: Conn) -> dict[str, set[UUID]]:
    """Tasks that succeeded on days 1, 2 and 3, and one that died on day 2."""
    parse_pdf = app.tasks["parse_pdf"]
    ids = app.enqueue_many(
        [parse_pdf.using(tenant=f"t{i % 3}").prepare(f"{i}.pdf") for i in range(9)], connection=conn
    )
    claimed = db.run(conn, core.claim(["pdfs"], 9, "w"))
    done = db.run(conn, core.complete([(t.id, t.attempt) for t in claimed[1:8]]))
    kept = KeptResult(claimed[0].token, '{"pages": 3}', None, 86400 * 30)
    done |= db.transact(conn, complete_keeping([kept]))
    assert len(done) == 8
    by_day: dict[str, set[UUID]] = {}
    for n, task_id in enumerate(ids[:8]):
        day = (DAY_1, DAY_2, DAY_3)[n % 3]
        conn.execute(
            "UPDATE rota.finished SET finished_at = %s WHERE task_id = %s",
            [day + timedelta(hours=n), task_id],
        )
        by_day.setdefault(day.strftime("%Y-%m-%d"), set()).add(task_id)
    dead = ids[8]
    conn.execute("DELETE FROM rota.running WHERE task_id = %s", [dead])
    conn.execute(
        "UPDATE rota.tasks SET status = 'dead', finished_at = %s, last_error = 'boom' "
        "WHERE id = %s",
        [DAY_2 + timedelta(hours=20), dead],
    )
    by_day[DAY_2.strftime("%Y-%m-%d")].add(dead)
    return by_day


def _archived(spark: Any, location: str) -> dict[str, list[Any]]:
    rows = spark.read.parquet(location).collect()
    found: dict[str, list[Any]] = {}
    for row in rows:
        found.setdefault(str(row["day"]), []).append(row)
    return found


def test_ended_tasks_are_archived_by_day_and_queue_each_once(
    spark: Any, app: App, settings: Settings, conn: Conn, tmp_path: Path
) -> None:
    by_day = _ended(app, conn)
    location = f"file://{tmp_path}/archive"
    first = archive(settings, DAY_3, location, session=spark)
    day_1, day_2 = DAY_1.strftime("%Y-%m-%d"), DAY_2.strftime("%Y-%m-%d")
    assert (first.since, first.tasks, first.days) == (None, 7, [day_1, day_2])
    assert (tmp_path / "archive" / f"day={day_2}" / "queue=pdfs").is_dir()
    found = _archived(spark, location)
    assert {day: {UUID(r["task_id"]) for r in rows} for day, rows in found.items()} == {
        day_1: by_day[day_1],
        day_2: by_day[day_2],
    }
    [dead] = [r for r in found[day_2] if r["status"] == "dead"]
    assert (dead["name"], dead["last_error"], dead["tenant"]) == ("parse_pdf", "boom", "t2")
    assert '"8.pdf"' in dead["payload"]
    results = [r["result"] for rows in found.values() for r in rows if r["result"] is not None]
    assert results == ['{"pages": 3}']  # the one success that kept its result

    # The same bound again: nothing new, nothing rewritten.
    again = archive(settings, DAY_3, location, session=spark)
    assert (again.tasks, again.days) == (0, [])
    # The next day: only it, and the days before stay as they were.
    later = archive(settings, TODAY, location, session=spark)
    assert (later.since, later.tasks) == (DAY_3.isoformat(), 2)
    found = _archived(spark, location)
    assert sum(len(rows) for rows in found.values()) == 9

    # A run that wrote its days but died before its ledger row: run again,
    # the days' partitions are replaced, each task still there once.
    conn.execute("DELETE FROM rota.archives WHERE before = %s", [TODAY])
    retried = archive(settings, TODAY, location, session=spark)
    assert retried.tasks == 2
    rows = spark.read.parquet(location).collect()
    assert len(rows) == len({r["task_id"] for r in rows}) == 9


def test_retention_waiting_for_the_archive_keeps_what_it_has_not_written(
    spark: Any, app: App, settings: Settings, conn: Conn, tmp_path: Path
) -> None:
    by_day = _ended(app, conn)
    waiting = settings.model_copy(
        update={"retention_waits_for_archive": True, "finished_retention": 3600.0}
    )
    maintenance = Maintenance(waiting)
    result = TickResult()
    maintenance.prune_finished(conn, result)
    assert "finished" not in result.pruned  # nothing archived yet: nothing goes
    assert conn.execute("SELECT count(*) FROM rota.finished").fetchone() == (8,)

    archive(settings, DAY_2, f"file://{tmp_path}/archive", session=spark)
    maintenance.prune_finished(conn, result)
    day_1 = by_day[DAY_1.strftime("%Y-%m-%d")]
    assert result.pruned["finished"] == len(day_1)
    left = {row[0] for row in conn.execute("SELECT task_id FROM rota.finished")}
    assert not left & day_1 and len(left) == 8 - len(day_1)
