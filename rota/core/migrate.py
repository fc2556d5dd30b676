"""`rota migrate`: brings a database to the newest schema, idempotently.

A fresh database gets the current schema (rota/sql/schema.sql) in one go; an
existing one gets each migration it lacks, in order, each in its own
transaction. Concurrent runs take turns on an advisory lock. A test proves
that both paths end in the same schema.
"""

from __future__ import annotations

from typing import Any

import psycopg

from rota.core import db
from rota.sql import current_schema, migrations, query


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
) -> list[int]:
    """Applies what is missing; returns the versions applied now.

    `target` stops at a version; `step_by_step` applies every migration even on
    a fresh database (how the equivalence test builds its reference).
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


def _apply(conn: psycopg.Connection[Any], target: int | None, step_by_step: bool) -> list[int]:
    all_migrations = migrations()
    newest = all_migrations[-1].version
    target = newest if target is None else target
    done: list[int] = []
    with conn.transaction():
        conn.execute(query("migration_lock"))
        applied = set(applied_versions(conn))
        if not applied and target == newest and not step_by_step:
            conn.execute(current_schema().encode())
            for m in all_migrations:
                conn.execute(query("record_migration"), {"version": m.version, "name": m.name})
            return [m.version for m in all_migrations]
    for m in all_migrations:
        if m.version in applied or m.version > target:
            continue
        with conn.transaction():
            conn.execute(query("migration_lock"))
            if m.version in set(applied_versions(conn)):
                continue  # a concurrent run got there first
            conn.execute(m.sql.encode())
            conn.execute(query("record_migration"), {"version": m.version, "name": m.name})
        done.append(m.version)
    return done
