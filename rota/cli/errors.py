"""The CLI's errors: one line that says what to do, with passwords masked."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pydantic
import redis

from rota.errors import RotaError
from rota.runtime.hints import connection_fix
from rota.runtime.redact import redact

# lock_not_available, query_canceled
GAVE_UP = ("55P03", "57014")
EXPECTED = 2  # a problem the user can fix: bad input, a server down, no schema
UNEXPECTED = 1


def explain(exc: BaseException) -> tuple[str, int]:
    """(one line, exit code) for an error that reached the command line."""
    first = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    known = database(exc, first)
    if known is not None:
        return known
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        hint = (
            "set ROTA_REDIS_URL, or run `rota dev` in this directory for development "
            "servers (the default, redis://localhost:6379/0, was used)"
            if not _given("ROTA_REDIS_URL")
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
    if type(exc).__module__.split(".")[0] in ("py4j", "pyspark"):
        return _spark(exc)
    if isinstance(exc, ModuleNotFoundError) and (extra := _extra_of(exc.name)):
        return f"{first}: install rota's {extra} extra: pip install 'rota[{extra}]'", EXPECTED
    return (
        f"unexpected {type(exc).__name__}: {first} (run with --debug for the traceback)",
        UNEXPECTED,
    )


def database(exc: BaseException, first: str) -> tuple[str, int] | None:
    """The CLI's one reading of a PostgreSQL error (`first`: its first line,
    masked): what the server refused or gave up on (it was reached), then
    what kept it from being reached; None for any other error."""
    if not isinstance(exc, psycopg.Error):
        return None
    # A deadlock or a serialization failure (class 40), a lock or statement
    # timeout: the server was reached, and the command may be run again.
    sqlstate = exc.sqlstate or ""
    if sqlstate.startswith("40") or sqlstate in GAVE_UP:
        return (
            f"PostgreSQL rolled the transaction back: {first}; "
            "nothing of it was applied: run the command again",
            EXPECTED,
        )
    if isinstance(exc, psycopg.errors.InvalidSchemaName | psycopg.errors.UndefinedTable):
        return f"the database has no rota schema yet: run `rota migrate` ({first})", EXPECTED
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return f"the database role may not do this: {first}", EXPECTED
    if isinstance(exc, psycopg.OperationalError):
        known = connection_fix(exc)
        if known is not None:
            return f"PostgreSQL refused the connection: {first}; {known}", EXPECTED
        hint = (
            "set ROTA_DATABASE_URL, or run `rota dev` in this directory for development "
            "servers (the default, postgresql://localhost/postgres, was used)"
            if not _given("ROTA_DATABASE_URL")
            else "is PostgreSQL running, and is ROTA_DATABASE_URL right?"
        )
        return f"cannot reach PostgreSQL: {first}; {hint}", EXPECTED
    if isinstance(exc, psycopg.ProgrammingError) and exc.sqlstate is None:  # parsed client-side
        return f"ROTA_DATABASE_URL is not a valid PostgreSQL URL: {first}", EXPECTED
    return None


def _spark(exc: BaseException) -> tuple[str, int]:
    """A Spark failure: the Java exception's own line, the setting to change
    when it ran out of memory, and where Spark's log is."""
    from rota.loader.spark_session import log_file

    text = redact(str(exc))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # The root cause is the last "Caused by:"; else py4j's ": <exception>" line.
    causes = [line.removeprefix("Caused by:").strip() for line in lines if "Caused by:" in line]
    thrown = [line.lstrip(": ") for line in lines if line.startswith(": ")]
    cause = (causes[-1:] or thrown or lines or [type(exc).__name__])[0]
    where = f"Spark's log: {log_file()} (or --spark-log-level warn)"
    if "OutOfMemoryError" in text:
        return (
            f"Spark ran out of memory ({cause[:200]}): give it more with "
            f"--conf spark.driver.memory=4g (or spark.executor.memory on a cluster); {where}",
            EXPECTED,
        )
    return f"Spark failed: {cause[:300]}; {where}", EXPECTED


def unavailable(server: str, said: str) -> str:
    """The line of a command that reads around a server it cannot reach
    (`rota stats`): what it said, and the fix when rota knows it."""
    fix = connection_fix(said) if server == "postgresql" else None
    return f"{server} unavailable: {said}" + (f"; {fix}" if fix else "")


def _given(name: str) -> bool:
    """Whether the setting is in the environment or in .env here (where
    `rota dev` writes it), rather than left to its default."""
    if name in os.environ:
        return True
    try:
        lines = Path(".env").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return False
    return any(line.split("=", 1)[0].strip().removeprefix("export ") == name for line in lines)


# The optional dependencies of rota's extras (pyproject.toml), by the module
# a command imports.
_EXTRAS = {
    "pyspark": "spark",
    "py4j": "spark",
    "pandas": "spark",
    "pyarrow": "spark",
    "starlette": "dashboard",
    "jinja2": "dashboard",
    "uvicorn": "dashboard",
    "multipart": "dashboard",
    "python_multipart": "dashboard",
    "opentelemetry": "otel",
    "django": "django",
    "sqlalchemy": "sqlalchemy",
}


def _extra_of(module: str | None) -> str | None:
    """The extra that installs `module`, if it is one of an extra's."""
    return _EXTRAS.get((module or "").split(".")[0])
