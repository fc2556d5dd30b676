"""Migrations: a fresh schema equals every migration applied step by step."""

from __future__ import annotations

import subprocess
import threading

import psycopg

from rota.core.migrate import applied_versions, migrate
from rota.sql import migrations
from rota_tools.devservers import postgres_bindir


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


def test_fresh_schema_equals_all_migrations_applied(
    empty_database_url: str, database_url: str
) -> None:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        applied = migrate(conn, step_by_step=True)
    assert applied == [m.version for m in migrations()]
    assert _schema_dump(empty_database_url) == _schema_dump(database_url)


def test_migrating_twice_changes_nothing(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        before = applied_versions(conn)
        assert migrate(conn) == []
        assert applied_versions(conn) == before == [m.version for m in migrations()]


def test_migrating_stops_at_a_target_and_resumes(empty_database_url: str) -> None:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert migrate(conn, target=1) == [1]
        newest = migrations()[-1].version
        assert migrate(conn) == list(range(2, newest + 1))
        assert applied_versions(conn) == list(range(1, newest + 1))


def test_concurrent_migrations_take_turns(empty_database_url: str) -> None:
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with psycopg.connect(empty_database_url, autocommit=True) as conn:
                results.append(migrate(conn))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(len(r) for r in results) == [0, 0, 0, len(migrations())]
