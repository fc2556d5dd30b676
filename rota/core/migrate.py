"""`rota migrate`: brings a database to the newest schema, idempotently.

Tables, types and indexes are versioned: a fresh database gets the current
schema (rota/sql/schema.sql) in one go; an existing one gets each migration
it lacks (rota/sql/migrations/), in order, each in its own transaction. A
migration holds table, type, index and data statements only, and the drops
of functions and views a changed definition needs; it neither makes nor
calls a function. Migrations 0001-0047, written when migrations made
functions too, are cut to such statements: a database made by any earlier
commit takes those it lacks and ends as a fresh one does
(tests/fixtures/migrations/ holds databases made at 0030 and 0047 by the
last code that had them whole).

Functions, and the triggers and views that call them, are defined once each,
in the files of rota/sql/functions/, and applied after the migrations: a file
whose text changed since it was last applied (rota.repeatables keeps each
file's checksum), and every file in a run that applied a migration (a
migration may drop what a file makes). They are applied in one transaction:
the newest migration's, when the run applies it.

So a migration runs before the functions' new text, while the previous
release's functions are in place: it must not call a function counting on
its new text, nor leave a table the previous release's functions cannot
work with (its processes run on until they are replaced). A function whose
arguments or result type change is dropped by a migration, and made by its
file (CREATE OR REPLACE cannot change them); so is a view whose columns
change. Files are applied in the order of rota.sql.FUNCTION_FILES.

Concurrent runs take turns on an advisory lock. Tests prove that a fresh
database, one made migration by migration, and those of earlier versions
upgraded end in the same schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from rota.core import db
from rota.sql import current_schema, function_files, migrations, query


@dataclass(frozen=True)
class Migrated:
    """What a run applied: the migrations' versions, and the function files."""

    versions: list[int] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)


def applied_versions(conn: psycopg.Connection[Any]) -> list[int]:
    if not db.run(conn, db.value(query("migrations_table_exists"))):
        return []
    return db.run(conn, db.values(query("applied_migrations")))


ROLE_BLOCKS = ("create_roles", "own_schema", "grant_roles")


def roles_script() -> str:
    """The SQL of `rota migrate --roles`, for a DBA to read and run."""
    return "".join(f"{query(name)};\n\n" for name in ROLE_BLOCKS)


def migrate(
    conn: psycopg.Connection[Any],
    *,
    target: int | None = None,
    step_by_step: bool = False,
    roles: bool = False,
) -> Migrated:
    """Applies what is missing; returns what it applied now.

    `target` stops at a version (the function files wait for the newest);
    `step_by_step` applies every migration even on a fresh database (how the
    equivalence test builds its reference).
    `roles` creates rota's roles (rota/sql/roles.sql). Once they exist, every
    run migrates as rota_owner (when this user may become it) and renews the
    owner and the grants, so that new objects get them too.
    """
    if roles:
        conn.execute(query("create_roles"))
    if not db.run(conn, db.value(query("roles_exist"))):
        return _apply(conn, target, step_by_step)
    if applied_versions(conn):
        conn.execute(query("own_schema"))
    as_owner = db.run(conn, db.value(query("can_become_owner")))
    if as_owner:
        conn.execute(query("become_owner"))
    try:
        done = _apply(conn, target, step_by_step)
    finally:
        if as_owner:
            conn.execute(query("reset_role"))
    conn.execute(query("own_schema"))
    conn.execute(query("grant_roles"))
    return done


def _apply(conn: psycopg.Connection[Any], target: int | None, step_by_step: bool) -> Migrated:
    all_migrations = migrations()
    newest = all_migrations[-1].version
    target = newest if target is None else target
    with conn.transaction():
        conn.execute(query("migration_lock"))
        applied = set(applied_versions(conn))
        if not applied and target == newest and not step_by_step:
            conn.execute(current_schema().encode())
            for m in all_migrations:
                conn.execute(query("record_migration"), {"version": m.version, "name": m.name})
            return Migrated([m.version for m in all_migrations], _apply_functions(conn, True))
    done: list[int] = []
    for m in all_migrations:
        if m.version in applied or m.version > target:
            continue
        with conn.transaction():
            conn.execute(query("migration_lock"))
            if m.version in set(applied_versions(conn)):
                continue  # a concurrent run got there first
            conn.execute(m.sql.encode())
            conn.execute(query("record_migration"), {"version": m.version, "name": m.name})
            if m.version == newest:
                return Migrated([*done, m.version], _apply_functions(conn, True))
        done.append(m.version)
    if target < newest:
        return Migrated(done)
    with conn.transaction():
        conn.execute(query("migration_lock"))
        return Migrated(done, _apply_functions(conn, bool(done)))


def _apply_functions(conn: psycopg.Connection[Any], every_file: bool) -> list[str]:
    """Applies, in the caller's transaction and lock, the function files whose
    text changed since they were last applied (`every_file`: all of them);
    returns their names."""
    recorded = dict(conn.execute(query("recorded_function_files")).fetchall())
    done = []
    for file in function_files():
        if not every_file and recorded.get(file.name) == file.checksum:
            continue
        conn.execute(file.sql.encode())
        conn.execute(query("record_function_file"), {"name": file.name, "checksum": file.checksum})
        done.append(file.name)
    if done:
        conn.execute(query("revoke_public_execute"))
    return done
