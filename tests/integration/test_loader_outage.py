"""A loader that rides out a PostgreSQL outage loads what it had read: the
outage never uses up the entries' deliveries (they would be dead-lettered).
A drain never takes what it cannot store: it connects before it reads, hands
back what it read and could not load, and counts what other loaders hold
as work left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis

from rota import App, Settings, core
from rota.buffer.streams import dead_letter_stream
from rota.core import db
from rota.core.migrate import migrate
from rota.loader import Loader
from rota_tools.devservers import Server, local_postgres


@pytest.fixture
def own_postgres() -> Iterator[Server]:
    with local_postgres() as server:
        with psycopg.connect(server.url, autocommit=True) as conn:
            migrate(conn)
        yield server


def test_an_outage_longer_than_every_delivery_loses_nothing(
    own_postgres: Server, redis_url: str
) -> None:
    settings = Settings(
        database_url=own_postgres.url,
        redis_url=redis_url,
        loader_idle_reclaim_seconds=0.2,
        loader_max_deliveries=2,
        database_timeout_seconds=1,
    )
    app = App(settings)
    ids = app.enqueue_many([app.prepare("x.y", queue="q", tenant=f"t{i}") for i in range(30)])
    app.close()
    loader = Loader(settings)
    try:
        own_postgres.stop_immediately()
        # Within its time budget the drain rides the outage out, pass after
        # failing pass, for many more reclaim periods than deliveries allowed.
        failed = loader.drain(max_seconds=4)
        assert failed.errors and not failed.drained
        own_postgres.start_again()
        summary = loader.drain()
    finally:
        loader.close()
    assert summary.drained and summary.loaded == 30 and summary.dead_lettered == 0
    assert redis.Redis.from_url(redis_url).xlen(dead_letter_stream(settings.stream_prefix)) == 0
    with psycopg.connect(own_postgres.url, autocommit=True) as conn:
        assert len(db.run(conn, core.task_states(ids))) == 30


def _drain_command(settings: Settings, database_url: str) -> tuple[int, dict[str, Any]]:
    env = {
        **os.environ,
        "ROTA_DATABASE_URL": database_url,
        "ROTA_REDIS_URL": settings.redis_url,
        "ROTA_DATABASE_TIMEOUT_SECONDS": "2",
    }
    done = subprocess.run(
        [sys.executable, "-m", "rota", "loader", "drain", "--json"],
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    return done.returncode, json.loads(done.stdout.decode().strip().splitlines()[-1])


def test_a_drain_that_cannot_reach_postgresql_takes_no_entry(
    own_postgres: Server, redis_url: str
) -> None:
    """Found as a user would: 500 tasks, a drain against an unreachable
    database, then a working drain. It loads all 500 at once (none left
    pending for the reclaim idle time) and says drained only then."""
    settings = Settings(database_url=own_postgres.url, redis_url=redis_url)
    app = App(settings)
    for start in range(0, 500, 10):  # entries on every shard
        app.enqueue_many(
            [app.prepare("x.y", queue="q", tenant=f"t{i}") for i in range(start, start + 10)]
        )
    app.close()
    code, failed = _drain_command(settings, "postgresql://rota@127.0.0.1:1/nowhere")
    assert code == 1 and failed["errors"] and failed["entries"] == 0
    code, summary = _drain_command(settings, own_postgres.url)
    assert (code, summary["loaded"], summary["drained"]) == (0, 500, True), summary


def test_a_drain_whose_connection_dies_hands_back_what_it_read(
    own_postgres: Server, redis_url: str
) -> None:
    settings = Settings(database_url=own_postgres.url, redis_url=redis_url)
    app = App(settings)
    app.enqueue_many([app.prepare("x.y", queue="q", tenant=f"t{i}") for i in range(40)])
    app.close()
    loader = Loader(settings)
    try:
        pid = loader.conn.info.backend_pid  # connected, then cut off by the server
        with psycopg.connect(own_postgres.url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        failed = loader.drain()
        assert failed.errors and failed.released > 0 and not failed.drained
    finally:
        loader.close()
    # The next loader takes them in its first pass (the reclaim idle time,
    # 60 s by default, is not waited).
    again = Loader(settings)
    try:
        summary = again.drain()
    finally:
        again.close()
    assert summary.drained and summary.loaded == 40, summary


def test_a_drain_counts_entries_other_loaders_hold_as_work_left(
    own_postgres: Server, redis_url: str
) -> None:
    settings = Settings(database_url=own_postgres.url, redis_url=redis_url)
    app = App(settings)
    app.enqueue_many([app.prepare("x.y", queue="q", tenant=f"t{i}") for i in range(20)])
    app.close()
    busy, drain = Loader(settings, consumer="busy"), Loader(settings, consumer="cron")
    try:
        busy.ensure_groups()
        held = busy.reader.read_new(None)  # read, not yet loaded
        summary = drain.drain()
        assert not summary.drained and summary.exit_code == 2
        assert summary.pending_elsewhere == len(held) > 0
    finally:
        busy.close()
        drain.close()
