"""The schema version a database is at, checked by rota's processes when
they connect (at start, and after a reconnect; never per statement).

`rota migrate` records, in rota.schema_version, the schema version it made
(the newest line of rota/sql/schema_versions.txt) and the oldest version
whose processes still run on it (the forms of functions they call are
kept). A process of this rota needs `rota.sql.schema_version()`:

- on an older schema (or one made before versions were recorded: 0) it says
  `the database is at schema N, this rota needs M: run rota migrate` and
  waits, reading the version again every POLL_SECONDS, until it is migrated;
- on a newer one that still supports it, it runs, and says so;
- on a newer one that no longer does, it says so and waits (it is to be
  replaced by a newer rota).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import psycopg

from rota.core import db
from rota.core.rows import Rows
from rota.sql import query, schema_version

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0
# That a newer schema runs this rota is said once per process.
_said: set[str] = set()


class At(NamedTuple):
    version: int  # 0: before versions were recorded, or no schema at all
    supports_from: int


AT: Rows[At] = Rows(At)
NONE = (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName)


def _now() -> db.Op[At | None]:
    return db.first(query("schema_version_now"), None, AT)


def read(conn: psycopg.Connection[Any]) -> At:
    """The database's schema version (`conn` in autocommit)."""
    try:
        found = db.run(conn, _now())
    except NONE:
        return At(0, 0)
    return found or At(0, 0)


async def aread(conn: psycopg.AsyncConnection[Any]) -> At:
    try:
        found = await db.arun(conn, _now())
    except NONE:
        return At(0, 0)
    return found or At(0, 0)


def problem(at: At) -> str | None:
    """Why this rota cannot run on a database at `at`; None when it can."""
    needs = schema_version().version
    if at.version < needs:
        return f"the database is at schema {at.version}, this rota needs {needs}: run rota migrate"
    if at.supports_from > needs:
        return (
            f"the database is at schema {at.version}, which supports rota's schema "
            f"{at.supports_from} and later, not this rota's {needs}: upgrade rota"
        )
    return None


def _running(at: At, waited: bool) -> None:
    needs = schema_version().version
    if waited:
        log.warning("the database is at schema %d: running", at.version)
    message = (
        f"the database is at schema {at.version}, newer than this rota's {needs}, "
        "and still supports it: running"
    )
    if at.version > needs and message not in _said:
        _said.add(message)
        log.warning("%s", message)


def ready(
    conn: psycopg.Connection[Any], stopping: Callable[[], bool] = lambda: False
) -> psycopg.Connection[Any]:
    """`conn`, once its database's schema is one this rota runs on: until
    then it says why and waits (or until `stopping`)."""
    said = None
    while True:
        at = read(conn)
        why = problem(at)
        if why is None or stopping():
            break
        if why != said:
            log.warning("%s", why)
            said = why
        time.sleep(POLL_SECONDS)
    _running(at, said is not None)
    return conn


async def aready(conn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncConnection[Any]:
    """`ready`, for asyncio."""
    said = None
    while True:
        at = await aread(conn)
        why = problem(at)
        if why is None:
            break
        if why != said:
            log.warning("%s", why)
            said = why
        await asyncio.sleep(POLL_SECONDS)
    _running(at, said is not None)
    return conn
