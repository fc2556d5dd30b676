"""What the framework integrations share: a framework's psycopg connection
made fit for rota's statements, and the check that it reaches the database
rota's workers read (ROTA_DATABASE_URL)."""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from rota.errors import RotaError
from rota.runtime.redact import redact_url

_LOCAL = frozenset({"", "localhost", "127.0.0.1", "::1"})


class DifferentDatabase(RotaError):
    """A framework's connection reaches another database than ROTA_DATABASE_URL:
    a task written through it would never be seen by rota's workers."""


@contextmanager
def server_cursors(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """The connection, with psycopg's server-side-binding cursors while rota
    writes: rota reads results in binary, which client-side-binding cursors
    (Django's default) cannot. The framework's own factory is put back after."""
    factory = conn.cursor_factory
    conn.cursor_factory = psycopg.Cursor
    try:
        yield conn
    finally:
        conn.cursor_factory = factory


@asynccontextmanager
async def aserver_cursors(
    conn: psycopg.AsyncConnection[Any],
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    factory = conn.cursor_factory
    conn.cursor_factory = psycopg.AsyncCursor
    try:
        yield conn
    finally:
        conn.cursor_factory = factory


def _host(host: str | None) -> str:
    host = (host or "").lower()
    # Loopback names and Unix-socket directories are all "this machine".
    return "local" if host in _LOCAL or host.startswith("/") else host


@functools.lru_cache(maxsize=16)
def _places(url: str) -> tuple[frozenset[str], frozenset[str], str | None]:
    """(hosts, ports, database) a URL names, libpq's environment defaults applied."""
    params = conninfo_to_dict(url)
    hosts = str(params.get("host") or os.environ.get("PGHOST", ""))
    ports = str(params.get("port") or os.environ.get("PGPORT", "5432"))
    dbname = params.get("dbname") or os.environ.get("PGDATABASE") or params.get("user")
    return (
        frozenset(_host(h) for h in hosts.split(",")),
        frozenset(p or "5432" for p in ports.split(",")),
        str(dbname) if dbname else None,
    )


def check_same_database(info: psycopg.ConnectionInfo, url: str, what: str) -> None:
    """Raises DifferentDatabase unless `info` (a connection's) is on the host,
    port and database `url` names."""
    hosts, ports, dbname = _places(url)
    if (
        _host(info.host) in hosts
        and str(info.port) in ports
        and (dbname is None or info.dbname == dbname)
    ):
        return
    raise DifferentDatabase(
        f"{what} is database {info.dbname!r} on {info.host}:{info.port}, but rota's "
        f"database is {redact_url(url)} (ROTA_DATABASE_URL): a task written in that "
        "transaction would never reach rota's workers. Point both at the same "
        "database (with rota's schema migrated in it), or enqueue without connection=."
    )
