"""Real servers for the integration and acceptance tiers, and how the suite is
scheduled.

One PostgreSQL and one Redis per test session (per xdist worker: each worker
is a session of its own), started from the machine's own binaries on free
loopback ports (rota_tools/devservers.py), with their data in fresh temporary
directories. Each test that asks for `database_url` gets a fresh database
cloned from a migrated template.

Scheduling (`make test` runs `pytest -n 2 --dist loadgroup`):
- tests that share a module-scoped fixture (a Spark session, a Redis Cluster,
  a TLS server) run on one worker, as one unit, so it is built once;
- `@pytest.mark.slow(reason=...)` tests are scheduled first, each on its own,
  so the two workers finish together; they get the `slow_timeout` budget
  instead of the default `timeout` (both in pyproject.toml).
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from rota import App, Settings
from rota.core.migrate import migrate
from rota_tools.devservers import Server, local_redis, start_postgres

_counter = itertools.count()

# The session's PostgreSQL is thrown away at the end: no fsync (a process
# killed or stopped with -m immediate loses nothing without it; only the
# machine crashing would), and no shutdown checkpoint of the hundreds of
# databases the tests made (seconds on a busy disk).
THROWAWAY_POSTGRES = {"fsync": "off"}

# The JVMs of the Spark tests (drivers, executors, a standalone cluster) live
# seconds: the quick JIT alone starts them sooner, for less CPU.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("slow_timeout", "pytest-timeout's budget for @pytest.mark.slow tests (s)")


def _module_scoped(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        defs[-1].scope in ("module", "class", "package")
        for defs in info.name2fixturedefs.values()
        if defs
    )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow_timeout = float(config.getini("slow_timeout") or 0)
    for item in items:
        slow = item.get_closest_marker("slow")
        if slow is not None:
            if not slow.kwargs.get("reason"):
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.slow needs a reason=")
            if slow_timeout and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(slow_timeout))
        elif _module_scoped(item) and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))

    # Slow tests first, then the grouped units (a shared fixture and several
    # tests), then the rest: the longest work is handed out first.
    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("slow") is not None:
            return 0
        return 1 if item.get_closest_marker("xdist_group") is not None else 2

    items[:] = sorted(items, key=rank)  # stable: each rank in collection order


def _replace_db(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Server]:
    server = start_postgres(settings=THROWAWAY_POSTGRES)
    try:
        yield server
    finally:
        server.stop_immediately()
        shutil.rmtree(server.directory, ignore_errors=True)


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
