"""Migrations: a database made by an earlier version (tests/fixtures/migrations,
made by rota_tools.migration_fixtures) upgrades to the fresh schema with its
rows, every migration applied step by step makes it too, and the function
files are applied again exactly when their text changes."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from rota.core import migrate as migrate_module
from rota.core.migrate import Migrated, applied_versions, migrate
from rota.sql import function_files, migrations
from rota_tools.migration_fixtures import VERSIONS, WORKFLOWS, dump, restore

ALL_FILES = [file.name for file in function_files()]
FIXTURES = Path(__file__).parents[1] / "fixtures" / "migrations"
NEWEST = migrations()[-1].version


def _schema_dump(url: str) -> str:
    return dump(url, schema_only=True)


def _recorded(conn: psycopg.Connection[Any]) -> dict[str, tuple[str, Any]]:
    rows = conn.execute("SELECT name, checksum, applied_at FROM rota.repeatables").fetchall()
    return {name: (checksum, at) for name, checksum, at in rows}


def _rows(conn: psycopg.Connection[Any], columns: dict[str, list[str]]) -> dict[str, list[Any]]:
    """Each table's rows, as {column: value}, in a stable order."""
    rows = {}
    for table, names in columns.items():
        select = psycopg.sql.SQL("SELECT {} FROM {}").format(
            psycopg.sql.SQL(", ").join(map(psycopg.sql.Identifier, names)),
            psycopg.sql.Identifier("rota", table),
        )
        found = [dict(zip(names, row, strict=True)) for row in conn.execute(select)]
        rows[table] = sorted(found, key=repr)
    return rows


def _columns(conn: psycopg.Connection[Any]) -> dict[str, list[str]]:
    """The columns of rota's tables, but for the migrations' own bookkeeping."""
    found: dict[str, list[str]] = {}
    for table, column in conn.execute(
        "SELECT c.table_name, c.column_name FROM information_schema.columns c"
        " JOIN information_schema.tables t USING (table_schema, table_name)"
        " WHERE c.table_schema = 'rota' AND t.table_type = 'BASE TABLE'"
        " AND c.table_name NOT IN ('migrations', 'repeatables')"
        " ORDER BY 1, c.ordinal_position"
    ):
        found.setdefault(table, []).append(column)
    return found


WORKER = ("fixture-worker", b"fixture-secret")  # registered by rota_tools/sql/fixtures.sql


def _claim(conn: psycopg.Connection[Any], queue: str) -> list[tuple[Any, int]]:
    return conn.execute(
        "SELECT id, attempt FROM rota.worker_claim(%s, %s, %s, 10, 60)", (*WORKER, [queue])
    ).fetchall()


def _complete(conn: psycopg.Connection[Any], claimed: list[tuple[Any, int]]) -> list[Any]:
    ids, attempts = [list(c) for c in zip(*claimed, strict=True)]
    return [
        row[0]
        for row in conn.execute(
            "SELECT * FROM rota.worker_complete(%s, %s, %s, %s)", (*WORKER, ids, attempts)
        )
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_database_of_an_earlier_version_upgrades_to_the_fresh_schema_with_its_rows(
    version: int, empty_database_url: str, database_url: str
) -> None:
    restore(empty_database_url, FIXTURES / f"{version:04d}.sql.gz")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert applied_versions(conn) == list(range(1, version + 1))
        columns = _columns(conn)
        before = _rows(conn, columns)
        assert len(before["tasks"]) >= 5 and before["running"] and before["finished"]
        waiting = {
            row[0]
            for row in conn.execute(
                "SELECT r.task_id FROM rota.ready r JOIN rota.queues q ON q.id = r.queue_id"
                " WHERE q.name = 'default'"
            )
        }
        running = conn.execute("SELECT task_id, attempt FROM rota.running").fetchall()
        assert migrate(conn).versions == list(range(version + 1, NEWEST + 1))
        assert applied_versions(conn) == list(range(1, NEWEST + 1))
        # Every row is kept as it was, in the columns this version still has.
        now = _columns(conn)
        kept = {t: [c for c in names if c in now[t]] for t, names in columns.items()}
        assert _rows(conn, kept) == {
            table: sorted(({c: row[c] for c in kept[table]} for row in rows), key=repr)
            for table, rows in before.items()
        }
    assert _schema_dump(empty_database_url) == _schema_dump(database_url)

    # The rows work with this version's functions: what waited is claimed, what
    # ran completes with its attempt token, and so does a join's member.
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert {task_id for task_id, _ in _claim(conn, "default")} == waiting
        assert _complete(conn, running) == [task_id for task_id, _ in running]
        if version < WORKFLOWS:
            return
        result = conn.execute(
            "SELECT r.value FROM rota.results k, rota.task_result(k.task_id) r"
        ).fetchall()
        assert result == [({"total": 3},)]
        member = _claim(conn, "flows")
        assert len(member) == 1 and _complete(conn, member) == [member[0][0]]
        released = conn.execute(
            "SELECT j.released, s.run_at <= now() FROM rota.joins j"
            " JOIN rota.scheduled s ON s.task_id = j.task_id"
        ).fetchall()
        assert released == [(True, True)]


def test_fresh_schema_equals_all_migrations_applied(
    empty_database_url: str, database_url: str
) -> None:
    """Every migration from the first, then the files, makes the fresh schema:
    the steps before the 0030 fixture are checked here."""
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        applied = migrate(conn, step_by_step=True)
        steps_recorded = {name: checksum for name, (checksum, _) in _recorded(conn).items()}
    assert applied == Migrated([m.version for m in migrations()], ALL_FILES)
    assert _schema_dump(empty_database_url) == _schema_dump(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        fresh_recorded = {name: checksum for name, (checksum, _) in _recorded(conn).items()}
    assert steps_recorded == fresh_recorded == {f.name: f.checksum for f in function_files()}


def test_migrating_twice_changes_nothing(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        before = applied_versions(conn), _recorded(conn)
        assert migrate(conn) == Migrated()
        assert migrate(conn) == Migrated()
        assert (applied_versions(conn), _recorded(conn)) == before
        assert before[0] == [m.version for m in migrations()]


def test_migrating_stops_at_a_target_and_resumes(empty_database_url: str) -> None:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert migrate(conn, target=1) == Migrated([1])  # the files wait for the newest
        newest = migrations()[-1].version
        assert migrate(conn) == Migrated(list(range(2, newest + 1)), ALL_FILES)
        assert applied_versions(conn) == list(range(1, newest + 1))


def test_a_changed_function_file_is_applied_again_and_the_others_are_not(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = function_files()
    (retention,) = [f for f in files if f.name == "functions/retention.sql"]
    # A changed body, and a function made new: it gets no EXECUTE for PUBLIC.
    probe = "CREATE OR REPLACE FUNCTION rota.probe() RETURNS integer LANGUAGE sql AS 'SELECT 1';"
    changed = replace(
        retention,
        sql=retention.sql.replace("SELECT NOT EXISTS", "SELECT /* changed */ NOT EXISTS")
        + f"\n{probe}\n",
    )
    assert changed.checksum != retention.checksum
    edited = tuple(changed if f is retention else f for f in files)
    monkeypatch.setattr(migrate_module, "function_files", lambda: edited)
    with psycopg.connect(database_url, autocommit=True) as conn:
        before = _recorded(conn)
        assert migrate(conn) == Migrated(functions=["functions/retention.sql"])
        after = _recorded(conn)
        assert after.pop("functions/retention.sql")[0] == changed.checksum
        before.pop("functions/retention.sql")
        assert after == before  # neither applied again nor recorded again
        body, public = conn.execute(
            "SELECT prosrc, has_function_privilege('public', 'rota.probe()', 'EXECUTE')"
            " FROM pg_proc WHERE oid = 'rota.caller_is_admin()'::regprocedure"
        ).fetchone()
        assert "/* changed */" in body and not public
        assert migrate(conn) == Migrated()


def _concurrently(url: str, runs: int = 4) -> list[Migrated]:
    """What each of `runs` concurrent `migrate` calls applied, fewest first."""
    results: list[Migrated] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                results.append(migrate(conn))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    return sorted(results, key=lambda r: (len(r.versions), len(r.functions)))


def test_concurrent_migrations_take_turns(empty_database_url: str) -> None:
    # One run makes the schema and applies the files; the others find it done.
    assert _concurrently(empty_database_url) == [
        Migrated(),
        Migrated(),
        Migrated(),
        Migrated([m.version for m in migrations()], ALL_FILES),
    ]


def test_concurrent_runs_apply_a_changed_file_once(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE rota.repeatables SET checksum = 'older' WHERE name = 'functions/claim.sql'"
        )
    assert _concurrently(database_url) == [
        Migrated(),
        Migrated(),
        Migrated(),
        Migrated(functions=["functions/claim.sql"]),
    ]
