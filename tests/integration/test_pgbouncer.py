"""rota behind a real PgBouncer, set up as the README's "Behind PgBouncer" says:
the session settings on the role, and a URL that names its own `options`."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from rota import db, ops
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
        for setting, value in db.SESSION_SETTINGS.items():
            admin.execute(
                sql.SQL("ALTER ROLE rota IN DATABASE {} SET {} = {}").format(
                    sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)
                )
            )

    # ... and the URL names its own (empty) options.
    url = _through(pgbouncer, database_url, "?options=")
    with db.connect(url) as conn:
        for setting, value in db.SESSION_SETTINGS.items():
            assert conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting))).fetchone() == (
                value,
            )
        assert load(conn, envelopes("a", 300) + envelopes("b", 3)) == 303
        # More runs than psycopg's prepare threshold: prepared statements work.
        claimed = []
        for _ in range(12):
            got = db.run(conn, ops.claim(["default"], 10, "w"))
            assert db.run(conn, ops.complete(t.token for t in got)) == {t.id for t in got}
            claimed += got
        # Fair order through the pooler too: b's three tasks among the first claims.
        assert [t.tenant for t in claimed[:6]].count("b") == 3
        assert len({t.id for t in claimed}) == 120
