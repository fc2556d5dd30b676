"""`rota migrate`: brings a database to the newest schema, idempotently,
in one transaction, beside live traffic.

Tables, types and indexes are versioned: a fresh database gets the current
schema (rota/sql/schema.sql) in one go; an existing one gets each migration
it lacks (rota/sql/migrations/), in order. A migration holds table, type,
index and data statements only, and the drops of functions and views a
changed definition needs; it neither makes nor calls a function. Migrations
0001-0047, written when migrations made functions too, are cut to such
statements: a database made by any earlier commit takes those it lacks and
ends as a fresh one does (tests/fixtures/migrations/ holds databases made at
0030 and 0047 by the last code that had them whole).

Functions, and the triggers and views that call them, are defined once each,
in the files of rota/sql/functions/, and applied after the migrations: a file
whose text changed since it was last applied (rota.repeatables keeps each
file's checksum), and every file in a run that applied a migration (a
migration may drop what a file makes). Files are applied in the order of
rota.sql.FUNCTION_FILES. A function whose arguments or result type change is
dropped by a migration, and made by its file (CREATE OR REPLACE cannot
change them); so is a view whose columns change. The previous release's
processes run on until they are replaced: the forms of functions they call
stay for a release (docs/howto/upgrade.md), and a migration must not leave a
table they cannot work with.

One run is one transaction: the pending migrations, the function files, the
owner and grants of `--roles`, and the schema version (rota.schema_version:
the ledger's newest line, rota/sql/schema_versions.txt). Processes see the
old schema or the new one, never a part of it; they check the version when
they connect (rota.core.versions). Before any change the transaction locks
every table and view of the schema in one statement, waiting at most
LOCK_WAIT_SECONDS: live traffic either holds a lock it wants, and it gives
way (rolls back, waits a little, and tries again, saying so), or it holds
them all and waits for nothing while it runs. It gives way before
PostgreSQL's deadlock detection would pick a process of the queue, and
reports a deadlock or a lock timeout as what it is once ATTEMPTS are spent.

Concurrent runs take turns on an advisory lock. A database at a newer schema
version than this rota's is left as it is. Tests prove that a fresh
database, one made migration by migration, and those of earlier versions
upgraded end in the same schema.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from rota.core import db, versions
from rota.errors import RotaError
from rota.sql import current_schema, function_files, migrations, query, schema_version, sql_checksum

log = logging.getLogger(__name__)

# A lock wait's bound, below PostgreSQL's default deadlock_timeout (1 s).
LOCK_WAIT_SECONDS = 0.5
# Tries of the whole transaction (a minute or two, with the pauses between).
ATTEMPTS = 40


class _Busy(Exception):
    """The schema's tables were not all locked within LOCK_WAIT_SECONDS."""


# What live traffic makes a try fail with: all of it rolled back, and tried again.
GIVES_WAY = (
    _Busy,
    psycopg.errors.LockNotAvailable,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
)


class MigrationBlocked(RotaError):
    """Every try of `rota migrate` gave way to live traffic; nothing was applied."""


@dataclass(frozen=True)
class Migrated:
    """What a run applied: the migrations' versions, and the function files;
    `newer`: the database's schema version, when it is newer than this rota's
    (nothing is applied)."""

    versions: list[int] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    newer: int | None = None


def applied_versions(conn: psycopg.Connection[Any]) -> list[int]:
    if not db.run(conn, db.value(query("migrations_table_exists"))):
        return []
    return db.run(conn, db.values(query("applied_migrations")))


ROLE_BLOCKS = ("create_roles", "own_schema", "grant_roles")


def roles_script() -> str:
    """The SQL of `rota migrate --roles`, for a DBA to read and run."""
    return "".join(f"{query(name)};\n\n" for name in ROLE_BLOCKS)


def _log_retry(waited: float, attempt: int) -> None:
    log.warning(
        "rota migrate: waited %.1fs for a lock held by live traffic; trying again (attempt %d)",
        waited,
        attempt,
    )


def migrate(
    conn: psycopg.Connection[Any],
    *,
    target: int | None = None,
    step_by_step: bool = False,
    roles: bool = False,
    on_retry: Callable[[float, int], None] = _log_retry,
) -> Migrated:
    """Applies what is missing, in one transaction; returns what it applied.

    `target` stops at a version (the function files wait for the newest);
    `step_by_step` applies every migration even on a fresh database (how the
    equivalence test builds its reference).
    `roles` creates rota's roles (rota/sql/roles.sql). Once they exist, every
    run that applies something migrates as rota_owner (when this user may
    become it) and renews the owner and the grants, so that new objects get
    them too.
    `on_retry(seconds, attempt)` is told of each try that gave way to live
    traffic before the next one (`attempt`) starts.
    """
    if roles:
        conn.execute(query("create_roles"))
    done = Migrated()
    while True:
        step, finished = _given_way(conn, target, step_by_step, roles, on_retry)
        done = Migrated(done.versions + step.versions, step.functions, step.newer)
        if finished:
            return done


def _given_way(
    conn: psycopg.Connection[Any],
    target: int | None,
    step_by_step: bool,
    roles: bool,
    on_retry: Callable[[float, int], None],
) -> tuple[Migrated, bool]:
    """One transaction of `_run`, tried again while live traffic is in its way."""
    for attempt in range(1, ATTEMPTS + 1):
        started = time.monotonic()
        try:
            with conn.transaction():
                return _run(conn, target, step_by_step, roles)
        except GIVES_WAY as exc:
            waited = time.monotonic() - started
            if attempt == ATTEMPTS:
                raise MigrationBlocked(
                    f"rota migrate gave way to live traffic {ATTEMPTS} times (the last "
                    f"time: {str(exc).strip().splitlines()[0]}); nothing was applied: "
                    "run it again when the queue is quieter"
                ) from exc
            on_retry(waited, attempt + 1)
            time.sleep(min(2.0, 0.1 * attempt) * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")


def _run(
    conn: psycopg.Connection[Any], target: int | None, step_by_step: bool, roles: bool
) -> tuple[Migrated, bool]:
    """One try, in the caller's transaction: what it applied, and whether
    that is all (a migration that adds a value to an enum ends its
    transaction, which PostgreSQL must commit before the value is used)."""
    conn.execute(query("migration_lock"))  # waits for a concurrent run, unbounded
    all_migrations = migrations()
    newest = all_migrations[-1].version
    target = newest if target is None else target
    applied = set(applied_versions(conn))
    recorded_at = db.run(conn, db.value(query("schema_version_table_exists")))
    at = versions.read(conn) if recorded_at else versions.At(0, 0)
    ours = schema_version()
    if at.version > ours.version:
        return Migrated(newer=at.version), True
    fresh = not applied and target == newest and not step_by_step
    pending = [m for m in all_migrations if m.version not in applied and m.version <= target]
    enums = [i for i, m in enumerate(pending[:-1]) if "ADD VALUE" in m.sql.upper()]
    cut = bool(enums) and not fresh
    if cut:
        pending = pending[: enums[0] + 1]
        target = pending[-1].version  # the rest in the next transaction
    files = _changed_files(conn, every_file=bool(pending)) if target == newest else []
    recorded = target != newest or at == versions.At(ours.version, ours.supports_from)
    if not pending and not files and recorded and not roles:
        return Migrated(), True
    ms = str(int(LOCK_WAIT_SECONDS * 1000))
    conn.execute(query("bound_lock_waits"), {"ms": ms})
    try:
        conn.execute(query("lock_schema"))
    except psycopg.errors.QueryCanceled as exc:  # the statement's bound, not one lock's
        raise _Busy(f"the schema's tables were not locked within {LOCK_WAIT_SECONDS}s") from exc
    conn.execute(query("unbound_statements"))
    has_roles = db.run(conn, db.value(query("roles_exist")))
    if has_roles and applied:
        conn.execute(query("own_schema"))
    as_owner = has_roles and db.run(conn, db.value(query("can_become_owner")))
    if as_owner:
        conn.execute(query("become_owner"))
    if fresh:
        conn.execute(current_schema().encode())
    else:
        for m in pending:
            conn.execute(m.sql.encode())
    for m in pending:
        conn.execute(query("record_migration"), {"version": m.version, "name": m.name})
    done = _apply_functions(conn, files)
    if target == newest:
        conn.execute(
            query("record_schema_version"),
            {
                "version": ours.version,
                "supports_from": ours.supports_from,
                "checksum": sql_checksum(),
            },
        )
    if as_owner:
        conn.execute(query("reset_role"))
    if has_roles:
        conn.execute(query("own_schema"))
        conn.execute(query("grant_roles"))
    return Migrated([m.version for m in pending], done), not cut


def _changed_files(conn: psycopg.Connection[Any], every_file: bool) -> list[Any]:
    """The function files to apply: those whose text changed since they were
    last applied (`every_file`: all of them)."""
    if every_file or not db.run(conn, db.value(query("repeatables_table_exists"))):
        return list(function_files())
    recorded = dict(conn.execute(query("recorded_function_files")).fetchall())
    return [f for f in function_files() if recorded.get(f.name) != f.checksum]


def _apply_functions(conn: psycopg.Connection[Any], files: list[Any]) -> list[str]:
    """Applies `files` in the caller's transaction; returns their names."""
    for file in files:
        conn.execute(file.sql.encode())
        conn.execute(query("record_function_file"), {"name": file.name, "checksum": file.checksum})
    if files:
        conn.execute(query("revoke_public_execute"))
    return [file.name for file in files]
