"""The CLI's errors: one line that says what to do, with passwords masked."""

from __future__ import annotations

import os

import psycopg
import pydantic
import redis

from rota.errors import RotaError
from rota.redact import redact

EXPECTED = 2  # a problem the user can fix: bad input, a server down, no schema
UNEXPECTED = 1


def explain(exc: BaseException) -> tuple[str, int]:
    """(one line, exit code) for an error that reached the command line."""
    first = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    if isinstance(exc, psycopg.errors.InvalidSchemaName | psycopg.errors.UndefinedTable):
        return f"the database has no rota schema yet: run `rota migrate` ({first})", EXPECTED
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return f"the database role may not do this: {first}", EXPECTED
    if isinstance(exc, psycopg.OperationalError):
        hint = (
            "set ROTA_DATABASE_URL (the default, postgresql://localhost/postgres, was used)"
            if "ROTA_DATABASE_URL" not in os.environ
            else "is PostgreSQL running, and is ROTA_DATABASE_URL right?"
        )
        return f"cannot reach PostgreSQL: {first}; {hint}", EXPECTED
    if isinstance(exc, psycopg.ProgrammingError) and exc.sqlstate is None:  # parsed client-side
        return f"ROTA_DATABASE_URL is not a valid PostgreSQL URL: {first}", EXPECTED
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        hint = (
            "set ROTA_REDIS_URL (the default, redis://localhost:6379/0, was used)"
            if "ROTA_REDIS_URL" not in os.environ
            else "is Redis running, and is ROTA_REDIS_URL right?"
        )
        return f"cannot reach Redis: {first}; {hint}", EXPECTED
    if isinstance(exc, redis.AuthenticationError | redis.exceptions.NoPermissionError):
        return f"Redis refused rota's user: {first}; check ROTA_REDIS_URL", EXPECTED
    if isinstance(exc, ValueError) and "redis" in str(exc).lower() and "url" in str(exc).lower():
        return f"ROTA_REDIS_URL is not a valid Redis URL: {first}", EXPECTED
    if isinstance(exc, pydantic.ValidationError):
        problems = "; ".join(
            f"ROTA_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}" for e in exc.errors()
        )
        return f"bad setting: {redact(problems)}", EXPECTED
    if isinstance(exc, RotaError):
        return first, EXPECTED
    return (
        f"unexpected {type(exc).__name__}: {first} (run with --debug for the traceback)",
        UNEXPECTED,
    )
