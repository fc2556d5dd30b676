"""The load's COPY leaves out the columns whose values are rota.tasks'
defaults (copy_tasks_lean) only when every task of the chunk keeps them: a
task stored either way reads back as it was sent."""

from __future__ import annotations

from typing import Any

import psycopg

from rota.core.copyrows import LEAN_DEFAULTS
from rota.core.load import SMALL_LOAD
from rota.model.envelope import TaskEnvelope
from tests.helpers import envelopes, load

Conn = psycopg.Connection[Any]
COLUMNS = ("cost", "max_attempts", "backoff_base", "backoff_max")


def stored(conn: Conn, tasks: list[TaskEnvelope]) -> dict[Any, tuple[Any, ...]]:
    rows = conn.execute(
        "SELECT id, cost, max_attempts, backoff_base, backoff_max, eta, status::text,"
        " payload::text, tenant, name FROM rota.tasks WHERE id = ANY (%s)",
        ([t.id for t in tasks],),
    ).fetchall()
    return {row[0]: row[1:] for row in rows}


def sent(task: TaskEnvelope) -> tuple[Any, ...]:
    status = "scheduled" if task.eta is not None else "pending"
    return (
        task.cost,
        task.max_attempts,
        task.backoff_base,
        task.backoff_max,
        task.eta,
        status,
        task.payload,
        task.tenant,
        task.name,
    )


def test_the_defaults_left_out_are_rota_tasks_column_defaults(conn: Conn) -> None:
    defaults = dict(
        conn.execute(
            "SELECT a.attname, pg_get_expr(d.adbin, d.adrelid)"
            " FROM pg_attribute a JOIN pg_attrdef d"
            " ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
            " WHERE a.attrelid = 'rota.tasks'::regclass AND a.attname = ANY (%s)",
            (list(COLUMNS),),
        ).fetchall()
    )
    assert set(defaults) == set(COLUMNS)
    for column in COLUMNS:
        (value,) = conn.execute(f"SELECT {defaults[column]}").fetchone()  # type: ignore[misc]
        assert value == LEAN_DEFAULTS[column], column
    # No ETA leaves a task pending, the status's default.
    ((status,),) = conn.execute(
        "SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d JOIN pg_attribute a"
        " ON a.attrelid = d.adrelid AND a.attnum = d.adnum"
        " WHERE d.adrelid = 'rota.tasks'::regclass AND a.attname = 'status'"
    ).fetchall()
    assert status.startswith("'pending'")


def test_tasks_at_the_defaults_and_a_chunk_with_one_that_is_not_read_back_as_sent(
    conn: Conn,
) -> None:
    lean = envelopes("plain", SMALL_LOAD * 2)  # a COPY, every task at the defaults
    assert load(conn, lean) == len(lean)
    # One task of the chunk off the defaults: every column is sent.
    mixed = envelopes("mixed", SMALL_LOAD * 2)
    mixed[-1] = envelopes("mixed", 1, cost=2.5, max_attempts=7, backoff_base=0.5)[0]
    assert load(conn, mixed) == len(mixed)
    for batch in (lean, mixed):
        found = stored(conn, batch)
        assert found == {t.id: sent(t) for t in batch}
    assert stored(conn, mixed[-1:])[mixed[-1].id][:3] == (2.5, 7, 0.5)
    # In line at their fair places either way.
    (in_line,) = conn.execute(  # type: ignore[misc]
        "SELECT count(*) FROM rota.ready WHERE task_id = ANY (%s)",
        ([t.id for t in lean + mixed],),
    ).fetchone()
    assert in_line == len(lean) + len(mixed)
