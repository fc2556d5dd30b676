"""Real servers for the integration and acceptance tiers, and how the suite is
scheduled.

One PostgreSQL and one Redis per test session (per xdist worker: each worker
is a session of its own), started from the machine's own binaries on free
loopback ports (rota_tools/devservers.py), with their data in fresh temporary
directories. Each test that asks for `database_url` gets a fresh database
cloned from a migrated template.

Scheduling (`make test` runs `pytest -n 2 --dist loadgroup`):
- tests that share a module-scoped fixture (a Redis Cluster, a TLS server)
  run on one worker, as one unit, so it is built once; so do the tests that
  use the session's Spark (`spark`);
- `@pytest.mark.slow(reason=...)` tests are scheduled first, each on its own,
  so the two workers finish together; they get the `slow_timeout` budget
  instead of the default `timeout` (both in pyproject.toml).
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
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
THROWAWAY_POSTGRES = {
    "fsync": "off",
    "max_wal_size": "256MB",
    "min_wal_size": "32MB",
    # As on the benchmarks' own servers: `rota bench load` times enqueue -> commit.
    "track_commit_timestamp": "on",
}


def _scratch_in_memory(least_free: int = 4 << 30) -> None:
    """Puts the suite's temporary files (the servers' data directories above
    all) on tmpfs when the machine has room: each test's database is a copy of
    the template, some 600 small files, which takes 15 ms in memory and
    100-150 ms on a virtual disk. Set once by the first process; xdist's
    workers and every server the tests start inherit it."""
    shm = Path("/dev/shm")
    if "TMPDIR" in os.environ or not (shm.is_dir() and os.access(shm, os.W_OK)):
        return
    if shutil.disk_usage(shm).free < least_free:
        return
    directory = tempfile.mkdtemp(prefix="rota-tests-", dir=shm)
    os.chmod(directory, 0o755)  # PostgreSQL runs as its own user when the suite is root
    os.environ["TMPDIR"] = directory
    tempfile.tempdir = None  # read TMPDIR again
    atexit.register(shutil.rmtree, directory, ignore_errors=True)


_scratch_in_memory()

# The JVMs of the Spark tests (drivers, executors, a standalone cluster) live
# seconds: the quick JIT alone starts them sooner, for less CPU.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("slow_timeout", "pytest-timeout's budget for @pytest.mark.slow tests (s)")


def _module_scoped(item: pytest.Item) -> bool:
    """Whether the test uses a module-, class- or package-scoped fixture of
    the suite's own (a plugin's, such as pytest-django's autouse class
    fixture, has no base id and is on every test)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        defs[-1].scope in ("module", "class", "package") and defs[-1].baseid
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
        elif item.get_closest_marker("xdist_group") is not None:
            pass
        elif _module_scoped(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        elif "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))  # one JVM for them all

    # Slow tests first, then the grouped units (a shared fixture and several
    # tests), then the rest: the longest work is handed out first.
    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("slow") is not None:
            return 0
        return 1 if item.get_closest_marker("xdist_group") is not None else 2

    items[:] = sorted(items, key=rank)  # stable: each rank in collection order


_UNGROUPED = (
    "pytest-xdist's --dist loadgroup did not group the tests (their node ids carry no"
    " @group), so shared fixtures would be built on every worker: install the pytest"
    " that pyproject.toml asks for"
)
_ungrouped: list[str] = []


@pytest.hookimpl(trylast=True)  # after xdist marked the groups in the node ids
def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.getoption("loadgroup", False):
        return
    if any(
        item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid
        for item in session.items
    ):
        _ungrouped.append(_UNGROUPED)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _ungrouped:  # failing here, in each test, is what a worker can show
        pytest.fail(_ungrouped[0], pytrace=False)


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


def _fresh_database(server: Server, prefix: str, template: str | None) -> Iterator[str]:
    """A database of its own for one test, dropped after it (with whatever
    connections the test's processes left) so the server stays small."""
    plain = f"{prefix}_{next(_counter)}"
    name = psycopg.sql.Identifier(plain)
    create = psycopg.sql.SQL("CREATE DATABASE {}").format(name)
    if template:
        create += psycopg.sql.SQL(" TEMPLATE {}").format(psycopg.sql.Identifier(template))
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(create)
    yield _replace_db(server.url, plain)
    if server.process.poll() is None:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("DROP DATABASE {} WITH (FORCE)").format(name))


@pytest.fixture
def database_url(postgres_server: Server, template_url: str) -> Iterator[str]:
    yield from _fresh_database(postgres_server, "rota_test", "rota_template")


@pytest.fixture
def empty_database_url(postgres_server: Server) -> Iterator[str]:
    yield from _fresh_database(postgres_server, "rota_empty", None)


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session (a JVM, seconds to start) for every test that
    drives Spark in this process; the tests that use it run on one worker."""
    from rota.loader.spark import spark_session

    session = spark_session("local[2]", "rota-tests")
    yield session
    session.stop()


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
