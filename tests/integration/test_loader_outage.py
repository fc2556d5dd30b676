"""A loader that rides out a PostgreSQL outage loads what it had read: the
outage never uses up the entries' deliveries (they would be dead-lettered)."""

from __future__ import annotations

from collections.abc import Iterator

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
