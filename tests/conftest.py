"""Real servers for the integration and acceptance tiers.

One PostgreSQL and one Redis per test session, started from the machine's own
binaries on free loopback ports (rota_tools/devservers.py). Each test that asks for
`database_url` gets a fresh database cloned from a migrated template.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from rota import App, Settings
from rota.core.migrate import migrate
from rota_tools.devservers import Server, local_postgres, local_redis

_counter = itertools.count()


def _replace_db(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Server]:
    with local_postgres() as server:
        yield server


@pytest.fixture(scope="session")
def template_url(postgres_server: Server) -> str:
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE rota_template")
    url = _replace_db(postgres_server.url, "rota_template")
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
    return url


@pytest.fixture
def database_url(postgres_server: Server, template_url: str) -> str:
    name = f"rota_test_{next(_counter)}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("CREATE DATABASE {} TEMPLATE rota_template").format(
                psycopg.sql.Identifier(name)
            )
        )
    return _replace_db(postgres_server.url, name)


@pytest.fixture
def empty_database_url(postgres_server: Server) -> str:
    name = f"rota_empty_{next(_counter)}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    return _replace_db(postgres_server.url, name)


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Server]:
    with local_redis() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: Server) -> str:
    import redis

    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    return redis_server.url


@pytest.fixture
def settings(database_url: str, redis_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        redis_url=redis_url,
        shards=4,
        loader_idle_reclaim_seconds=1.0,
        redis_timeout=0.3,
        breaker_reset_seconds=0.5,
        capacity_cache_seconds=0.0,
    )


@pytest.fixture
def app(settings: Settings) -> Iterator[App]:
    application = App(settings)

    @application.task(queue="pdfs", max_attempts=2)
    def parse_pdf(path: str, pages: int = 1) -> int:
        return pages

    yield application
    application.close()
