"""The overview only reads: `rota stats`, the console's overview and its
/metrics work under a role that cannot write, and reading them writes
nothing, however stale maintenance's counts are."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from starlette.testclient import TestClient
from typer.testing import CliRunner

from rota import Settings, core
from rota.cli import app as cli
from rota.core import db
from rota.dashboard.app import create_app
from rota.readmodel.figures import gather
from tests.helpers import envelopes, load

Conn = psycopg.Connection[Any]


@pytest.fixture
def stale(conn: Conn) -> Conn:
    """Tasks waiting, counted by maintenance a day ago: a reader that
    recounted when the counts are old would write now."""
    load(conn, envelopes("alice", 3, queue="pdfs") + envelopes("bob", 1, queue="pdfs"))
    db.run(conn, core.refresh_stats())
    conn.execute("UPDATE rota.stats_counted SET at = at - interval '1 day'")
    return conn


@pytest.fixture
def reader_url(database_url: str, conn: Conn) -> Iterator[str]:
    """A login role that may only read: SELECT, and EXECUTE on the reading
    function the fair shares need; its transactions are all read-only (a
    SECURITY DEFINER function cannot write for it either)."""
    name = f"rota_reader_{uuid.uuid4().hex[:8]}"
    role = sql.Identifier(name)
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(role))
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA rota TO {}").format(role))
    conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA rota TO {}").format(role))
    # The fair shares' reading function (STABLE, the caller's rights).
    minutes = "rota.tenant_minutes(integer[], timestamptz, timestamptz)"
    conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(sql.SQL(minutes), role))
    conn.execute(sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(role))
    assert "rota@" in database_url
    yield database_url.replace("rota@", f"{name}@", 1)
    conn.execute(sql.SQL("DROP OWNED BY {}").format(role))
    conn.execute(sql.SQL("DROP ROLE {}").format(role))


def _counts(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT s.*, c.at FROM rota.stats s, rota.stats_counted c ORDER BY queue_id, tenant_id"
    ).fetchall()


def test_the_overview_reads_under_a_role_that_cannot_write(
    stale: Conn, reader_url: str, redis_url: str
) -> None:
    refused = (psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.InsufficientPrivilege)
    with psycopg.connect(reader_url, autocommit=True) as reader:
        for write in ("SELECT rota.refresh_stats()", "UPDATE rota.stats_counted SET at = now()"):
            with pytest.raises(refused):
                reader.execute(write)
    before = _counts(stale)
    settings = Settings(database_url=reader_url, redis_url=redis_url, shards=4)

    figures = gather(settings, top=5)
    assert figures.unavailable == {}
    assert [(q.name, q.waiting) for q in figures.queues] == [("pdfs", 4)]
    assert [(t.name, t.waiting) for t in figures.tenants] == [("alice", 3), ("bob", 1)]

    env = {"ROTA_DATABASE_URL": reader_url, "ROTA_REDIS_URL": redis_url}
    done = CliRunner().invoke(cli, ["stats", "--json"], env=env)
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["unavailable"] == {}

    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        overview = client.get("/api/overview").json()
        assert overview["unavailable"] == {} and overview["queues"][0]["waiting"] == 4
        assert client.get("/").status_code == 200
        scraped = client.get("/metrics").text
        assert 'rota_server_up{server="postgresql"} 1.0' in scraped
        assert 'rota_queue_tasks{queue="pdfs",state="waiting"} 4.0' in scraped
    assert _counts(stale) == before


def test_reading_the_overview_writes_nothing(stale: Conn, settings: Settings) -> None:
    """Read in one transaction of a role that could write: no row changed,
    and no transaction id taken (PostgreSQL assigns one at the first write)."""
    before = _counts(stale)
    with psycopg.connect(settings.database_url, autocommit=True) as conn, conn.transaction():
        figures = gather(settings, postgres=lambda: contextlib.nullcontext(conn))
        assert figures.unavailable == {} and figures.queues[0].waiting == 4
        changed, xid = conn.execute(
            "SELECT (SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) "
            "        FROM pg_stat_xact_user_tables), pg_current_xact_id_if_assigned()"
        ).fetchone() or (None, None)
        assert (changed, xid) == (0, None)
    assert _counts(stale) == before
