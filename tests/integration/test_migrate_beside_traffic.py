"""`rota migrate` beside live traffic: it gives way to a lock it wants
(rolling its one transaction back and trying again, saying so), applies
everything once the lock is free, and, when every try gave way, says what
held it up, not that PostgreSQL cannot be reached; the CLI reads a deadlock
or a lock timeout as such."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from rota.cli.errors import explain
from rota.core import migrate as migrate_module
from rota.core.migrate import Migrated, MigrationBlocked, migrate
from rota.sql import schema_version
from tests.helpers import start_logged, wait_for

ROOT = Path(__file__).parents[2]


def _stale(conn: psycopg.Connection[Any]) -> None:
    """A function file to apply again, as after an upgrade."""
    conn.execute(
        "UPDATE rota.repeatables SET checksum = 'older' WHERE name = 'functions/claim.sql'"
    )


def test_it_waits_for_a_lock_held_by_traffic_then_applies_all(database_url: str) -> None:
    retries: list[tuple[float, int]] = []
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        psycopg.connect(database_url) as traffic,
    ):
        _stale(conn)
        traffic.execute("SELECT count(*) FROM rota.tasks")  # holds ACCESS SHARE until it ends
        done: list[Migrated] = []
        thread = threading.Thread(
            target=lambda: done.append(
                migrate(conn, on_retry=lambda waited, attempt: retries.append((waited, attempt)))
            )
        )
        thread.start()
        wait_for(lambda: len(retries) >= 2, 30, "migrate to give way twice")
        traffic.rollback()
        thread.join(60)
        assert done == [Migrated(functions=["functions/claim.sql"])]
        assert [attempt for _, attempt in retries[:2]] == [2, 3]
        assert all(waited >= migrate_module.LOCK_WAIT_SECONDS * 0.9 for waited, _ in retries)
        version = conn.execute("SELECT version FROM rota.schema_version").fetchone()
        assert version == (schema_version().version,)


def test_when_every_try_gives_way_it_says_so_and_applies_nothing(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migrate_module, "ATTEMPTS", 2)
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        psycopg.connect(database_url) as traffic,
    ):
        _stale(conn)
        traffic.execute("SELECT count(*) FROM rota.tasks")
        with pytest.raises(MigrationBlocked) as blocked:
            migrate(conn, on_retry=lambda waited, attempt: None)
        traffic.rollback()
        (checksum,) = conn.execute(
            "SELECT checksum FROM rota.repeatables WHERE name = 'functions/claim.sql'"
        ).fetchone()
        assert checksum == "older"  # nothing applied
    line, code = explain(blocked.value)
    assert code == 2 and "gave way to live traffic 2 times" in line and "reach" not in line


def test_the_command_says_it_tries_again(database_url: str) -> None:
    env = {**os.environ, "ROTA_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)}
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        psycopg.connect(database_url) as traffic,
    ):
        _stale(conn)
        traffic.execute("SELECT count(*) FROM rota.tasks")
        with start_logged([sys.executable, "-m", "rota", "migrate"], env=env) as command:
            says = "s for a lock held by live traffic; trying again (attempt 2)"
            wait_for(lambda: says in command.errors(), 60, "migrate to say it tries again")
            assert "rota migrate: waited 0." in command.errors()
            traffic.rollback()
            assert command.wait(60) == 0
            assert "applied function files: functions/claim.sql" in command.output()


def test_a_deadlock_or_a_lock_timeout_is_named_not_reachability(database_url: str) -> None:
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        psycopg.connect(database_url) as holder,
    ):
        holder.execute("LOCK TABLE rota.tasks IN ACCESS EXCLUSIVE MODE")
        conn.execute("SET lock_timeout = '10ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable) as timed_out:
            conn.execute("SELECT count(*) FROM rota.tasks")
        holder.rollback()
    line, code = explain(timed_out.value)
    assert code == 2
    assert line.startswith(
        "PostgreSQL rolled the transaction back: canceling statement due to lock"
    )
    assert "run the command again" in line and "reach" not in line
    deadlock = psycopg.errors.DeadlockDetected("deadlock detected\nDETAIL: Process 1 waits")
    line, code = explain(deadlock)
    assert (line, code) == (
        "PostgreSQL rolled the transaction back: deadlock detected; nothing of it was applied: "
        "run the command again",
        2,
    )
