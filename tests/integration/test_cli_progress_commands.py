"""Progress of `rota loader drain`, `rota archive` and `rota import` through real processes:
with --json each prints JSON lines on stderr (done, rate, time left where
known) while stdout keeps the summary; without it, off a terminal, nothing
but the summary."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from rota import App, Settings, core
from rota.core import db
from tests.integration.test_cli_errors import rota
from tests.integration.test_cli_operations import env_of

Conn = psycopg.Connection[Any]


def _lines(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_loader_drain_reports_each_pass(app: App, settings: Settings, conn: Conn) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    for i in range(24):  # an entry each
        app.enqueue_many([parse_pdf.using(tenant=f"t{i % 6}").prepare(f"{i}.pdf")])
    # Two entries a shard a pass: several passes, a progress line after each.
    env = {**env_of(settings), "ROTA_SHARDS": str(settings.shards), "ROTA_LOADER_READ_COUNT": "2"}
    done = rota("loader", "drain", "--json", **env)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["drained"] and summary["loaded"] == 24
    lines = _lines(done.stderr)
    assert len(lines) >= 3
    assert all(x["progress"] == "draining the buffer" and x["total"] == 24 for x in lines)
    entries = [x["done"] for x in lines]
    assert entries == sorted(entries) and entries[-1] == 24
    assert [x["loaded"] for x in lines][-1] == 24
    assert all(x["per_second"] > 0 and x["seconds_left"] >= 0 for x in lines)
    assert lines[-1]["seconds_left"] == 0
    assert conn.execute("SELECT count(*) FROM rota.tasks").fetchone() == (24,)

    # Off a terminal without --json: the summary alone.
    app.enqueue_many([parse_pdf.using(tenant="t0").prepare("last.pdf")])
    quiet = rota("loader", "drain", **env)
    assert quiet.returncode == 0 and json.loads(quiet.stdout)["loaded"] == 1
    assert _lines(quiet.stderr) == []


@pytest.mark.spark
def test_archive_reports_tasks_and_hours_read(
    app: App, settings: Settings, conn: Conn, tmp_path: Path
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    app.enqueue_many(
        [parse_pdf.using(tenant="t").prepare(f"{i}.pdf") for i in range(6)], connection=conn
    )
    claimed = db.run(conn, core.claim(["pdfs"], 6, "w"))
    db.run(conn, core.complete([(t.id, t.attempt) for t in claimed]))
    # Ended over three hours two days ago: three slices of an hour to read.
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    day -= timedelta(days=2)
    for n, task in enumerate(claimed):
        conn.execute(
            "UPDATE rota.finished SET finished_at = %s WHERE task_id = %s",
            [day + timedelta(hours=n % 3, minutes=n), task.id],
        )
    before = (day + timedelta(days=1)).strftime("%Y-%m-%d")
    location = f"file://{tmp_path}/archive"
    done = rota(
        "archive",
        "--before",
        before,
        "--to",
        location,
        "--master",
        "local[1]",
        "--json",
        **env_of(settings),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tasks"] == 6
    lines = _lines(done.stderr)
    assert lines and all(x["progress"] == "archiving tasks" and x["hours"] == 3 for x in lines)
    last = lines[-1]
    assert (last["done"], last["hours_read"], last["fraction"]) == (6, 3, 1)
    assert last["seconds_left"] == 0
    assert [x["done"] for x in lines] == sorted(x["done"] for x in lines)


@pytest.mark.spark
def test_import_reports_rows_read_loaded_and_rejected(
    settings: Settings, conn: Conn, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 3000
    names = ["app.parse"] * rows
    names[7] = "not a task name"  # rejected by the column checks
    tenants = [f"t{i % 20}" for i in range(rows)]
    path = tmp_path / "tasks.parquet"
    pq.write_table(pa.table({"name": names, "tenant": tenants}), path, row_group_size=500)
    done = rota("import", str(path), "--master", "local[1]", "--json", **env_of(settings))
    assert done.returncode == 2, done.stderr  # some rows were rejected
    assert json.loads(done.stdout)["loaded"] == rows - 1
    lines = _lines(done.stderr)
    assert lines and all(x["progress"] == "importing rows" for x in lines)
    last = lines[-1]
    # Parquet: the file's rows are known from its footers, so the time left is too.
    assert (last["done"], last["total"], last["loaded"], last["rejected"]) == (
        rows,
        rows,
        rows - 1,
        1,
    )
    assert last["fraction"] == 1 and last["seconds_left"] == 0
    assert [x["done"] for x in lines] == sorted(x["done"] for x in lines)
    assert conn.execute("SELECT count(*) FROM rota.tasks").fetchone() == (rows - 1,)
