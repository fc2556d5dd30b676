"""Every caller's tasks go through the one load (rota.core.load): the same
tasks given as envelopes (the cron, a workflow, a dead letter replayed), as
buffer entries (the Python and Spark loaders), as an import's columns and by
a transactional enqueue end in the same rows with the same places in line,
by INSERT and by COPY; a batch loaded again stores only what is new, its ids
given either way."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from rota import Settings, core
from rota.buffer.entries import TaskBatch
from rota.core import db
from rota.core.load import SMALL_LOAD, TaskColumns, columns_of
from rota.loader.rows import import_columns
from rota.loader.store import load_entries
from rota.model.envelope import envelope_template
from rota.producer import Producer
from tests.helpers import claim

Conn = psycopg.Connection[Any]
NOW = datetime.now(UTC)
SIZES = pytest.mark.parametrize("size", [40, SMALL_LOAD + 60], ids=["insert", "copy"])


def _batch(queue: str, count: int) -> TaskBatch:
    """Tasks of three tenants with varied costs, priorities and ETAs (some
    ahead: scheduled), the default retry policy and no limit key: what an
    import can carry too."""
    batch = TaskBatch(NOW)
    template = envelope_template("app.parse", queue, max_attempts=4)
    later = NOW + timedelta(days=1)
    for i in range(count):
        batch.add(
            template,
            f"t{i % 3}",
            [i],
            cost=1.0 + i % 2,
            eta=later if i % 10 == 9 else None,
            priority=i % 3 if i % 7 == 0 else 0,
        )
    return batch


def _imported(batch: TaskBatch) -> TaskColumns:
    """The batch as `rota import` builds its columns: ids as bytes."""
    n = len(batch)
    (template,) = batch.templates
    return import_columns(
        [u.bytes for u in batch.ids],
        [template.queue] * n,
        batch.tenants,
        [template.name] * n,
        batch.payloads,
        batch.costs,
        [template.max_attempts] * n,
        batch.etas,
        batch.priorities,
        batch.enqueued_at,
    )


def _by_envelopes(conn: Conn, batch: TaskBatch, settings: Settings) -> None:
    assert db.transact(conn, core.load(batch.envelopes())) == len(batch)


def _by_entries(conn: Conn, batch: TaskBatch, settings: Settings) -> None:
    half = len(batch) // 2
    entries = [("a", batch.select(range(half))), ("b", batch.select(range(half, len(batch))))]
    assert load_entries(conn, entries, settings.loader_batch_size) == (len(batch), [])


def _by_import(conn: Conn, batch: TaskBatch, settings: Settings) -> None:
    assert db.transact(conn, core.load(_imported(batch))) == len(batch)


def _by_transactional_enqueue(conn: Conn, batch: TaskBatch, settings: Settings) -> None:
    producer = Producer(settings)
    try:
        with conn.transaction():
            assert producer.store(batch, connection=conn) == batch.ids
    finally:
        producer.close()


ROUTES: dict[str, Callable[[Conn, TaskBatch, Settings], None]] = {
    "envelopes": _by_envelopes,
    "entries": _by_entries,
    "import": _by_import,
    "enqueue": _by_transactional_enqueue,
}


def _stored(conn: Conn, queue: str) -> list[tuple[Any, ...]]:
    """The queue's tasks as stored, in order of arrival, with their places."""
    return conn.execute(
        """
        SELECT t.tenant, t.name, t.payload::text, t.cost, t.max_attempts, t.backoff_base,
               t.backoff_max, t.status::text, t.eta, t.enqueued_at, t.priority, t.limit_key,
               t.join_id, r.vtime
        FROM rota.tasks t JOIN rota.queues q ON q.id = t.queue_id
        LEFT JOIN rota.ready r ON r.task_id = t.id
        WHERE q.name = %s ORDER BY t.seq
        """,
        [queue],
    ).fetchall()


@SIZES
def test_every_caller_ends_in_the_same_rows(conn: Conn, database_url: str, size: int) -> None:
    settings = Settings(database_url=database_url)
    stored = {}
    for route, load in ROUTES.items():
        queue = f"{route}-{size}"
        load(conn, _batch(queue, size), settings)
        stored[route] = _stored(conn, queue)
    assert len(stored["envelopes"]) == size
    assert any(row[7] == "scheduled" for row in stored["envelopes"])
    assert any(row[7] == "pending" for row in stored["envelopes"])
    for route in ROUTES:
        assert stored[route] == stored["envelopes"], route


@SIZES
@pytest.mark.parametrize("ids", ["uuids", "bytes"])
def test_a_batch_loaded_again_stores_only_what_is_new(conn: Conn, size: int, ids: str) -> None:
    queue = f"again-{ids}-{size}"
    batch = _batch(queue, size)
    first = batch.select(range(size // 2))

    def load(part: TaskBatch) -> int:
        tasks = columns_of(part.envelopes()) if ids == "uuids" else _imported(part)
        return db.transact(conn, core.load(tasks))

    assert load(first) == size // 2
    # One of them runs to its end: gone from the table, it must not come back.
    (ran,) = claim(conn, limit=1, queues=(queue,))
    assert db.transact(conn, core.complete([ran.token])) == {ran.id}
    # The stored ones fail the COPY (or are skipped by the INSERT): the load
    # rolls back to its savepoint and stores the rest.
    assert load(batch) == size - size // 2
    assert len(_stored(conn, queue)) == size - 1
    assert load(batch) == 0
