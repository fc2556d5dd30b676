"""rota.core.connections: what each purpose's connection is opened with, and
that it is the one module that opens them (no server here)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import rota
from rota import Settings
from rota.core import connections
from rota.core.connections import USES, Purpose

PACKAGE = Path(rota.__file__).parent
FACTORY = PACKAGE / "core" / "connections.py"

# Calls that open a PostgreSQL connection, by the name they resolve to; the
# URL entry (rota.core.db.connect) is for code that holds a URL, not Settings.
OPENERS = (
    "psycopg.connect",
    "psycopg.Connection.connect",
    "psycopg.AsyncConnection.connect",
    "psycopg_pool.",
    "rota.core.db.connect",
    "rota.core.db.aconnect",
)


def _imported_names(tree: ast.AST) -> dict[str, str]:
    """Each name a file binds by importing, and what it stands for."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _openers(path: Path) -> list[str]:
    """Where a file opens a connection itself: `line: name` of each call."""
    tree = ast.parse(path.read_text())
    names = _imported_names(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        dotted = _dotted(node.func)
        if dotted is None:
            continue
        head, _, rest = dotted.partition(".")
        resolved = names.get(head, head) + (f".{rest}" if rest else "")
        if any(resolved == o or (o.endswith(".") and resolved.startswith(o)) for o in OPENERS):
            found.append(f"{node.lineno}: {resolved}")
    return found


def test_postgresql_connections_are_opened_by_one_module() -> None:
    """Every connection rota opens comes from rota.core.connections, from
    the settings and a purpose."""
    opened = {
        str(path.relative_to(PACKAGE)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != FACTORY and (found := _openers(path))
    }
    assert opened == {}
    assert _openers(FACTORY)  # the check sees the calls it looks for


def test_the_check_resolves_what_a_file_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import psycopg\n"
        "from psycopg import AsyncConnection\n"
        "from psycopg_pool import ConnectionPool as Pool\n"
        "from rota.core import db\n"
        "psycopg.connect('')\n"
        "AsyncConnection.connect('')\n"
        "Pool('')\n"
        "db.connect('')\n"
        "db.run(None, None)\n"
    )
    assert _openers(source) == [
        "5: psycopg.connect",
        "6: psycopg.AsyncConnection.connect",
        "7: psycopg_pool.ConnectionPool",
        "8: rota.core.db.connect",
    ]


DIRECT = "postgresql://rota@db:5432/app"
POOLED = "postgresql://rota@pgbouncer:6432/app"


def _settings(**given: Any) -> Settings:
    return Settings(**{"database_url": DIRECT, **given})


@pytest.mark.parametrize("purpose", sorted(USES))
def test_every_purpose_is_named_bounded_and_reaches_its_url(purpose: Purpose) -> None:
    settings = _settings(database_timeout_seconds=3, database_dead_link_seconds=8)
    url, kwargs = connections.arguments(settings, purpose)
    assert url == DIRECT
    assert kwargs["autocommit"] is True
    assert kwargs["application_name"] == USES[purpose].application_name
    assert kwargs["application_name"].startswith("rota-")
    assert (kwargs["connect_timeout"], kwargs["keepalives_idle"], kwargs["tcp_user_timeout"]) == (
        3,
        2,
        8000,
    )
    # The dead-link bound is asked of the server's end too.
    assert "-c tcp_keepalives_idle=2 " in kwargs["options"]
    assert kwargs["options"].endswith("-c tcp_user_timeout=8000")
    rotas = "plan_cache_mode=force_generic_plan" in kwargs["options"]
    assert rotas is not USES[purpose].operator


def test_only_workers_claims_skip_the_wal_flush_and_only_the_console_times_out() -> None:
    relaxed = _settings(worker_synchronous_commit=False, console_statement_timeout_seconds=0.5)
    options = {p: connections.arguments(relaxed, p)[1]["options"] for p in USES}
    assert [p for p, o in options.items() if "synchronous_commit=off" in o] == ["claims"]
    assert [p for p, o in options.items() if "statement_timeout=500" in o] == ["console"]
    strict = _settings(worker_synchronous_commit=True)
    assert "synchronous_commit" not in connections.arguments(strict, "claims")[1]["options"]


def test_a_pooled_connection_sends_no_startup_options_and_prepares_nothing() -> None:
    settings = Settings(database_url=POOLED, database_pooling="transaction")
    for purpose in ("claims", "enqueue", "load", "admin", "console"):
        url, kwargs = connections.arguments(settings, purpose)
        assert url == POOLED
        assert "options" not in kwargs and kwargs["prepare_threshold"] is None


def test_a_session_goes_to_the_direct_url_behind_a_pooler() -> None:
    settings = Settings(
        database_url=POOLED, database_pooling="transaction", direct_database_url=DIRECT
    )
    for purpose in ("listen", "maintenance", "wait"):
        url, kwargs = connections.arguments(settings, purpose)
        assert url == DIRECT and "prepare_threshold" not in kwargs
        assert "plan_cache_mode=force_generic_plan" in kwargs["options"]
    assert connections.arguments(settings, "heartbeat")[0] == POOLED
    # Without a direct URL a result is polled through the pooler.
    alone = Settings(database_url=POOLED, database_pooling="transaction")
    url, kwargs = connections.arguments(alone, "wait")
    assert url == POOLED and kwargs["prepare_threshold"] is None


def test_what_the_url_names_it_keeps() -> None:
    named = (
        DIRECT + "?options=-c%20work_mem%3D1234kB&connect_timeout=2"
        "&application_name=mine&keepalives=0"
    )
    _, kwargs = connections.arguments(_settings(database_url=named), "claims")
    assert kwargs == {"autocommit": True}


def test_a_worker_names_itself_on_its_heartbeat() -> None:
    _, kwargs = connections.arguments(_settings(), "heartbeat", who="host:42")
    assert kwargs["application_name"] == "rota-worker:host:42"
    long = connections.application_name("heartbeat", "w" * 80)
    assert len(long) == connections.APPLICATION_NAME_MAX and long.endswith("w")


def test_overrides_win() -> None:
    _, kwargs = connections.arguments(_settings(), "claims", autocommit=False, keepalives_idle=9)
    assert kwargs["autocommit"] is False and "-c tcp_keepalives_idle=9 " in kwargs["options"]


def test_a_url_alone_gets_the_default_settings_not_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ROTA_DATABASE_POOLING", "transaction")
    settings = connections.at(DIRECT, synchronous_commit=False)
    assert settings.database_url == DIRECT and not settings.transaction_pooling
    assert "synchronous_commit=off" in connections.arguments(settings, "claims")[1]["options"]
    assert connections.at(POOLED, pooled=True).transaction_pooling


@pytest.mark.parametrize(("level", "pool_level"), [("info", "WARNING"), ("debug", "NOTSET")])
def test_the_pools_requests_are_not_logged_one_by_one(level: str, pool_level: str) -> None:
    import logging

    from rota.runtime import logs

    root, pool = logging.getLogger(), logging.getLogger("psycopg.pool")
    handlers, root_level, was = root.handlers[:], root.level, pool.level
    try:
        logs.configure(level)
        assert logging.getLevelName(pool.level) == pool_level
    finally:
        root.handlers[:] = handlers
        root.setLevel(root_level)
        pool.setLevel(was)
