"""rota behind a real PgBouncer, set up as the README's "Behind PgBouncer" says:
the session settings on the role, and a URL that names its own `options`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import sql

from rota import App, Settings, core
from rota.core import connections, db
from rota.errors import ValidationError
from rota.loader import Loader
from rota_tools.devservers import Server, local_pgbouncer
from tests.helpers import envelopes, load


@pytest.fixture(scope="module")
def pgbouncer(postgres_server: Server) -> Iterator[Server]:
    # Debian's pgbouncer (1.18) has no prepared statements in transaction
    # pooling, which rota's statements are after a few runs: session pooling
    # is what it supports.
    with local_pgbouncer(postgres_server, pool_mode="session") as server:
        yield server


def _through(pgbouncer: Server, database_url: str, query: str = "") -> str:
    return f"{pgbouncer.url}/{database_url.rsplit('/', 1)[1]}{query}"


def test_rota_needs_the_readme_setup_behind_pgbouncer(pgbouncer: Server, database_url: str) -> None:
    # rota's own startup options are refused...
    with pytest.raises(psycopg.OperationalError, match="options"):
        db.connect(_through(pgbouncer, database_url)).close()

    # ... so the settings go on the role (here for this database only) ...
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(database_url, autocommit=True) as admin:
        for setting, value in connections.SESSION_SETTINGS.items():
            admin.execute(
                sql.SQL("ALTER ROLE rota IN DATABASE {} SET {} = {}").format(
                    sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)
                )
            )

    # ... and the URL names its own (empty) options.
    url = _through(pgbouncer, database_url, "?options=")
    with db.connect(url) as conn:
        for setting, value in connections.SESSION_SETTINGS.items():
            assert conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting))).fetchone() == (
                value,
            )
        assert load(conn, envelopes("a", 300) + envelopes("b", 3)) == 303
        # More runs than psycopg's prepare threshold: prepared statements work.
        claimed = []
        for _ in range(12):
            got = db.run(conn, core.claim(["default"], 10, "w"))
            assert db.run(conn, core.complete(t.token for t in got)) == {t.id for t in got}
            claimed += got
        # Fair order through the pooler too: b's three tasks among the first claims.
        assert [t.tenant for t in claimed[:6]].count("b") == 3
        assert len({t.id for t in claimed}) == 120


def _role_settings(database_url: str) -> None:
    """The README's setup: rota's session settings on the role (here for this
    database only), since a transaction pooler takes no startup options."""
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(database_url, autocommit=True) as admin:
        for setting, value in connections.SESSION_SETTINGS.items():
            admin.execute(
                sql.SQL("ALTER ROLE rota IN DATABASE {} SET {} = {}").format(
                    sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)
                )
            )


CLIENTS = 200
SERVER_CONNECTIONS = 20  # PgBouncer's default_pool_size


def test_producers_loaders_and_200_claimers_work_through_pgbouncer_in_transaction_mode(
    postgres_server: Server, database_url: str, settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    _role_settings(database_url)
    with local_pgbouncer(postgres_server, "transaction", max_client_conn=CLIENTS + 20) as bouncer:
        pooled = settings.model_copy(
            update={
                "database_url": _through(bouncer, database_url),
                "database_pooling": "transaction",
                "direct_database_url": database_url,
            }
        )
        app = App(pooled)
        parse = app.task(name="app.parse", queue="default")(lambda n: None)
        # Through the buffer and a loader, and straight into PostgreSQL (the
        # fallback's path, in the caller's transaction) on the same pooler.
        ids = app.enqueue_many([parse.using(tenant=f"t{n % 20}").prepare(n) for n in range(3000)])
        ids += app.enqueue_many([parse.using(tenant="limited").prepare(n) for n in range(300)])
        with db.connect(pooled.database_url, pooled=True, autocommit=False) as own:
            ids += app.enqueue_many(
                [parse.using(tenant="direct").prepare(n) for n in range(100)], own
            )
            own.commit()
        app.close()
        loader = Loader(pooled)
        assert loader.drain().loaded == 3300
        loader.close()
        db.run(conn, core.configure_tenant("limited", concurrency_limit=2))

        claimed: list[UUID] = []
        most_running, most_backends = [0], [0]
        done = threading.Event()

        def claimer(number: int) -> None:
            with db.connect(pooled.database_url, pooled=True) as own:
                while got := db.run(own, core.claim(["default"], 5, f"w{number}")):
                    time.sleep(0.002)  # work: other claimers meet these tasks running
                    completed = db.run(own, core.complete(t.token for t in got))
                    assert completed == {t.id for t in got}
                    claimed.extend(t.id for t in got)

        def watch_limit() -> None:
            with psycopg.connect(database_url, autocommit=True) as direct:
                while not done.is_set():
                    row = direct.execute(
                        "SELECT count(*) FROM rota.running r JOIN rota.tasks t ON t.id = r.task_id"
                        " WHERE t.tenant = 'limited'"
                    ).fetchone()
                    most_running[0] = max(most_running[0], row[0] if row else 0)
                    # Backends on this database, less this one and the test's own.
                    row = direct.execute(
                        "SELECT count(*) - 2 FROM pg_stat_activity"
                        " WHERE datname = current_database() AND backend_type = 'client backend'"
                    ).fetchone()
                    most_backends[0] = max(most_backends[0], row[0] if row else 0)

        watcher = threading.Thread(target=watch_limit)
        watcher.start()
        with ThreadPoolExecutor(CLIENTS) as pool:
            for future in [pool.submit(claimer, n) for n in range(CLIENTS)]:
                future.result()
        done.set()
        watcher.join()

    assert sorted(claimed) == sorted(ids)  # every task once: none lost, none twice
    assert conn.execute("SELECT count(*) FROM rota.finished").fetchone() == (len(ids),)
    assert 1 <= most_running[0] <= 2  # the tenant's limit held
    assert 1 <= most_backends[0] <= SERVER_CONNECTIONS  # 200 clients shared the pool's 20


def test_behind_a_transaction_pooler_maintenance_needs_a_direct_url(settings: Settings) -> None:
    from rota.consumer import Maintenance
    from rota.consumer.maintenance import run_maintenance

    pooled = settings.model_copy(update={"database_pooling": "transaction"})
    with pytest.raises(ValidationError, match="ROTA_DIRECT_DATABASE_URL"):
        run_maintenance(pooled, Maintenance(pooled), threading.Event())


def test_behind_pgbouncer_without_the_setup_rota_names_the_fix(
    pgbouncer: Server, database_url: str, redis_url: str
) -> None:
    """The pooler refuses rota's startup options: the drain's error (as every
    loop's outage line) says which setting fixes it."""
    env = {
        **os.environ,
        "ROTA_DATABASE_URL": _through(pgbouncer, database_url),
        "ROTA_REDIS_URL": redis_url,
    }
    done = subprocess.run(
        [sys.executable, "-m", "rota", "loader", "drain", "--json"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    summary = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert done.returncode == 1, summary
    (error,) = summary["errors"]
    assert "startup parameter" in error and "ROTA_DATABASE_POOLING=transaction" in error
    # `rota stats` prints what it can, and the same fix for PostgreSQL.
    stats = subprocess.run(
        [sys.executable, "-m", "rota", "stats"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    [line] = [x for x in stats.stdout.splitlines() if x.startswith("postgresql unavailable")]
    assert "startup parameter" in line and "ROTA_DATABASE_POOLING=transaction" in line
    assert "Behind PgBouncer" in error
