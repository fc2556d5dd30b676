"""rota.report_progress against PostgreSQL: one statement stores many tasks'
progress, fenced by their attempt tokens as the other reports are (a worker
that lost the lease stores nothing; after the end, only the attempt that
ended the task); values out of bounds are skipped, not fatal to the rest;
and with roles, a worker stores its own tasks' progress only, through the
function, while producers read it by id."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from rota import core
from rota.core import db
from rota.core.progress import progress_of, report_progress, task_progress
from tests.helpers import claim, envelopes, load, wait_for
from tests.integration.test_roles import _refused, cluster, owner, urls

__all__ = ["cluster", "owner", "urls"]  # the roles' module-scoped server, for this module

Conn = psycopg.Connection[Any]


def _stored(conn: Conn, reports: list[tuple[tuple[uuid.UUID, int], Any]]) -> set[uuid.UUID]:
    return db.run(conn, report_progress(reports))


@pytest.fixture
def tasks(conn: Conn) -> Iterator[list[core.ClaimedTask]]:
    load(conn, envelopes("acme", 3, max_attempts=3))
    yield claim(conn, 3)


def test_one_statement_stores_many_tasks_and_skips_what_is_out_of_bounds(
    conn: Conn, tasks: list[core.ClaimedTask]
) -> None:
    a, b, c = tasks
    stored = _stored(
        conn,
        [
            (a.token, (1.0, 10.0, "x" * 600)),
            (b.token, (5.0, 4.0, None)),  # done above total
            (c.token, (float("nan"), None, None)),
        ],
    )
    assert stored == {a.id}
    assert _stored(conn, [(b.token, (-1.0, None, None)), (c.token, (1.0, float("inf"), None))]) == (
        set()
    )
    kept = db.run(conn, task_progress(a.id))
    assert kept is not None and (kept.done, kept.total, kept.attempt) == (1.0, 10.0, a.attempt)
    assert kept.message == "x" * 500  # the database's bound, should a report bypass the check
    assert db.run(conn, task_progress(b.id)) is None
    assert set(db.run(conn, progress_of([a.id, b.id, c.id]))) == {a.id}
    _stored(conn, [(a.token, (2.0, 10.0, None))])
    row = conn.execute("SELECT done, writes FROM rota.progress WHERE task_id = %s", [a.id])
    assert row.fetchone() == (2.0, 2)


def test_a_stale_token_stores_nothing_and_the_ending_attempt_stores_its_last(
    conn: Conn, tasks: list[core.ClaimedTask]
) -> None:
    a, b, c = tasks
    (task_id, attempt) = a.token
    assert _stored(conn, [((task_id, attempt + 1), (1.0, None, None))]) == set()
    assert _stored(conn, [((uuid.uuid4(), 1), (1.0, None, None))]) == set()
    # Ended: succeeded (a), failed to a retry (b), dead (c); each stores its
    # last values by the attempt that ended it, and by no other.
    assert db.run(conn, core.complete([a.token])) == {a.id}
    db.run(conn, core.fail([core.Failure(b.id, b.attempt, "again")]))
    db.run(conn, core.fail([core.Failure(c.id, c.attempt, "dead", final=True)]))
    last = (9.0, 9.0, "done")
    for ended in (a, b, c):
        assert _stored(conn, [((ended.id, ended.attempt + 1), last)]) == set()
        assert _stored(conn, [(ended.token, last)]) == {ended.id}
    # The retry runs: the first attempt's late values no longer count, and
    # never replace the second's.
    conn.execute("UPDATE rota.scheduled SET run_at = now() - interval '1 second'")
    db.run(conn, core.promote_due(100))
    (again,) = claim(conn, 1)
    assert again.token == (b.id, b.attempt + 1)
    assert _stored(conn, [(b.token, (1.0, None, None))]) == set()
    assert _stored(conn, [(again.token, (3.0, None, None))]) == {b.id}
    kept = db.run(conn, task_progress(b.id))
    assert kept is not None and (kept.done, kept.attempt) == (3.0, again.attempt)


def test_a_lease_that_ran_out_stores_nothing(conn: Conn) -> None:
    load(conn, envelopes("acme", 1))
    (task,) = claim(conn, 1, lease_seconds=0.05)
    passed = "SELECT lease_expires_at < now() FROM rota.running WHERE task_id = %s"
    wait_for(lambda: conn.execute(passed, [task.id]).fetchone() == (True,), what="the lease out")
    assert _stored(conn, [(task.token, (1.0, None, None))]) == set()


def test_with_roles_a_worker_stores_its_own_tasks_progress_and_a_producer_reads_it(
    urls: dict[str, str], owner: Conn
) -> None:
    db.transact(owner, core.load(envelopes("dora", 2)))
    mine, thief = core.WorkerKey.new("progress-w"), core.WorkerKey.new("progress-thief")
    with db.connect(urls["worker"]) as conn:
        for key in (mine, thief):
            db.run(conn, core.register_worker(key, "host", 5, ["default"], 4, 30.0))
        held = db.run(conn, core.claim(["default"], 2, mine))
        tokens = [t.token for t in held]
        values = [(token, (1.0, 2.0, "half")) for token in tokens]
        assert db.run(conn, report_progress(values, thief)) == set()
        assert db.run(conn, report_progress(values, mine)) == {t.id for t in held}
        forged = core.WorkerKey("progress-w", b"guessed")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            db.run(conn, report_progress(values, forged))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            db.run(conn, report_progress(values))  # without its key
        _refused(conn, "DELETE FROM rota.progress")
        for key in (mine, thief):
            db.run(conn, core.stop_worker(key))
    with db.connect(urls["producer"]) as conn:
        kept = db.run(conn, task_progress(held[0].id))
        assert kept is not None and (kept.done, kept.total, kept.message) == (1.0, 2.0, "half")
        _refused(conn, "SELECT * FROM rota.progress")
