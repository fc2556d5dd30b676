"""Migrations: a fresh schema equals every migration applied step by step, and
the function files are applied again exactly when their text changes."""

from __future__ import annotations

import subprocess
import threading
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from rota.core import migrate as migrate_module
from rota.core.migrate import Migrated, applied_versions, migrate
from rota.sql import function_files, migrations
from rota_tools.devservers import postgres_bindir

ALL_FILES = [file.name for file in function_files()]


def _schema_dump(url: str) -> str:
    result = subprocess.run(
        [str(postgres_bindir() / "pg_dump"), "--schema-only", "--schema=rota", "--no-owner", url],
        check=True,
        capture_output=True,
        text=True,
    )
    return "\n".join(
        line
        for line in result.stdout.splitlines()
        # Version banners and the per-dump random \restrict key differ by design.
        if not line.startswith(("-- Dumped", "\\restrict", "\\unrestrict"))
    )


def _recorded(conn: psycopg.Connection[Any]) -> dict[str, tuple[str, Any]]:
    rows = conn.execute("SELECT name, checksum, applied_at FROM rota.repeatables").fetchall()
    return {name: (checksum, at) for name, checksum, at in rows}


def test_fresh_schema_equals_all_migrations_applied(
    empty_database_url: str, database_url: str
) -> None:
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
