"""`rota import`'s column path: tasks loaded column by column take the places
`load()` gives the same tasks, refused rows are found and set aside, and a
tenant's rows keep their file order however Spark splits the file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from rota import Settings, core
from rota.core import db
from rota.core.load import TaskColumns, columns_of
from rota.loader.rows import import_columns
from rota.loader.store import load_in_chunks
from rota.model.envelope import TaskEnvelope

NOW = datetime.now(UTC)


def _tasks(queue: str, count: int) -> list[TaskEnvelope]:
    later = NOW + timedelta(days=1)
    return [
        TaskEnvelope(
            uuid4(),
            queue,
            f"t{i % 3}",
            "app.parse",
            f'{{"args":[{i}],"kwargs":{{}}}}',
            NOW,
            1.0 + i % 2,
            3 + i % 4,
            eta=later if i % 10 == 9 else None,
            priority=i % 3 if i % 7 == 0 else 0,
        )
        for i in range(count)
    ]


def _columns(tasks: list[TaskEnvelope]) -> TaskColumns:
    """The tasks as an import's columns: ids as bytes."""
    c = columns_of(tasks)
    rest = (c.queues, c.tenants, c.names, c.payloads, c.costs, c.max_attempts, c.etas)
    return import_columns([u.bytes for u in c.ids], *rest, c.priorities, NOW)


def _stored(conn: psycopg.Connection[Any], queue: str) -> list[tuple[Any, ...]]:
    """The queue's tasks as stored, in order of arrival, with their places."""
    return conn.execute(
        """
        SELECT t.tenant, t.name, t.payload::text, t.cost, t.max_attempts, t.status::text,
               t.eta, t.priority, r.vtime
        FROM rota.tasks t JOIN rota.queues q ON q.id = t.queue_id
        LEFT JOIN rota.ready r ON r.task_id = t.id
        WHERE q.name = %s ORDER BY t.seq
        """,
        [queue],
    ).fetchall()


@pytest.mark.parametrize("count", [40, 500])  # one INSERT; COPY
def test_columns_load_as_envelopes_do(conn: psycopg.Connection[Any], count: int) -> None:
    by_envelopes, by_columns = _tasks("envelopes", count), _tasks("columns", count)
    assert db.transact(conn, core.load(by_envelopes)) == count
    assert db.transact(conn, core.load(_columns(by_columns))) == count
    assert _stored(conn, "columns") == _stored(conn, "envelopes")
    assert any(row[5] == "scheduled" for row in _stored(conn, "columns"))
    # Loaded again, whole or in part: nothing twice.
    assert db.transact(conn, core.load(_columns(by_columns))) == 0
    more = _tasks("columns", 100)
    assert db.transact(conn, core.load(_columns(by_columns[:80] + more))) == 100
    assert len(_stored(conn, "columns")) == count + 100


def test_an_id_twice_in_the_columns_loads_its_first(conn: psycopg.Connection[Any]) -> None:
    tasks = _tasks("twice", 100)
    twin = TaskEnvelope(tasks[5].id, "twice", "t9", "app.other", '{"args":[],"kwargs":{}}', NOW)
    assert db.transact(conn, core.load(_columns([*tasks, twin]))) == 100
    assert conn.execute("SELECT count(*) FROM rota.tasks WHERE tenant = 't9'").fetchone() == (0,)


def test_rows_postgresql_refuses_are_found_and_the_rest_loaded(
    conn: psycopg.Connection[Any], database_url: str
) -> None:
    tasks = _columns(_tasks("refusals", 100))
    tasks.costs[70] = -1.0  # past the checks, as a bug would let through: CHECK refuses it
    with db.connect(database_url) as loader:
        stored, refused = load_in_chunks(loader, tasks, 40)
    assert stored == 99
    [(place, reason)] = refused
    assert place == 70 and reason.startswith("refused by PostgreSQL") and "cost" in reason
    assert len(_stored(conn, "refusals")) == 99


@pytest.fixture
def small_splits(spark: Any) -> Iterator[None]:
    """Files read in many small partitions (several per file)."""
    before = spark.conf.get("spark.sql.files.maxPartitionBytes")
    cost = spark.conf.get("spark.sql.files.openCostInBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "2048")
    spark.conf.set("spark.sql.files.openCostInBytes", "0")
    try:
        yield
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", before)
        spark.conf.set("spark.sql.files.openCostInBytes", cost)


def _in_file_order(conn: psycopg.Connection[Any]) -> bool:
    """Each tenant's tasks arrived (seq) and stand in line (vtime) in the
    order of the file (their argument is their row)."""
    rows = conn.execute(
        """
        SELECT t.tenant, (t.payload->'args'->>0)::int FROM rota.tasks t
        JOIN rota.ready r ON r.task_id = t.id ORDER BY t.tenant, r.vtime, t.seq
        """
    ).fetchall()
    by_seq = conn.execute(
        "SELECT tenant, (payload->'args'->>0)::int FROM rota.tasks ORDER BY tenant, seq"
    ).fetchall()
    return rows == sorted(rows) and by_seq == sorted(by_seq)


@pytest.mark.usefixtures("small_splits")
def test_gathered_by_tenant_a_tenants_rows_keep_file_order_across_partitions(
    spark: Any, settings: Settings, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rota.loader.importer import import_tasks

    rows = 3000
    table = pa.table(
        {
            "name": ["app.parse"] * rows,
            "tenant": [f"t{i % 7}" for i in range(rows)],
            "args": [f"[{i}]" for i in range(rows)],
        }
    )
    parquet = tmp_path / "tasks.parquet"
    pq.write_table(table, parquet, row_group_size=250)
    frame = spark.read.parquet(str(parquet))
    assert frame.rdd.getNumPartitions() > 2  # the file is read in several pieces
    summary = import_tasks(settings, str(parquet), session=spark, by_tenant=True)
    assert (summary.rows, summary.loaded, summary.rejected) == (rows, rows, 0)
    assert _in_file_order(conn)

    conn.execute("DELETE FROM rota.ready")
    conn.execute("DELETE FROM rota.tasks")
    csv = tmp_path / "tasks.csv"
    csv.write_text(
        "name,tenant,args\n"
        + "".join(f'app.parse,t{i % 7},"[{i}]"\n' for i in range(rows))
        + "app.parse,bad tenant,[0]\n"
    )
    assert spark.read.csv(str(csv)).rdd.getNumPartitions() > 2
    first = import_tasks(settings, str(csv), session=spark, by_tenant=True)
    assert (first.rows, first.loaded, first.rejected) == (rows + 1, rows, 1)
    assert _in_file_order(conn)
    assert first.rejected_path is not None
    [part] = Path(first.rejected_path).glob("part-*")
    [line] = [json.loads(text) for text in part.read_text().splitlines()]
    assert line["row"] == {"name": "app.parse", "tenant": "bad tenant", "args": "[0]"}
    # Each row's id is its place in the file, counted before the rows are
    # gathered: read again either way, nothing is new.
    again = import_tasks(settings, str(csv), session=spark)
    assert (again.loaded, again.duplicates) == (0, rows)
    gathered = import_tasks(settings, str(csv), session=spark, by_tenant=True)
    assert (gathered.loaded, gathered.duplicates) == (0, rows)
