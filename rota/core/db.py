"""Runs rota's database operations on sync and async psycopg connections alike.

Each operation (rota.core) is written once, as a generator that yields the
statements it needs (`Execute`, `Send`, `Copy`) and receives their rows back (see
rota.core.effects), built by column name as it asks (rota.core.rows). `run`
carries them out on a psycopg Connection, `arun` on an AsyncConnection.
`connect` opens one to a URL as rota opens its own (rota.core.connections).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import psycopg
from psycopg import sql as pgsql
from psycopg.pq import TransactionStatus

from rota.core import connections
from rota.core.arrays import UUIDArray as UUIDArray
from rota.core.arrays import UUIDBytesArray as UUIDBytesArray
from rota.core.connections import Purpose
from rota.core.effects import adrive, drive
from rota.core.rows import ONLY, Shape
from rota.core.rows import Row as Row

R = TypeVar("R")
T = TypeVar("T")
Params: TypeAlias = Mapping[str, Any] | Sequence[Any] | None
Statement: TypeAlias = str | pgsql.Composed

# PostgreSQL out of reach: the connection lost, or none to be made (refused,
# timed out, the server shutting down or starting up). What a loop waits out
# and reconnects after (rota.runtime.outage). A deadlock or a lock timeout is
# an OperationalError too, on a connection that is fine: a loop that holds a
# lock tells them apart by the connection (`closed`, `broken`).
SERVER_LOST: tuple[type[Exception], ...] = (psycopg.OperationalError,)


@dataclass(frozen=True)
class Execute:
    """Run one statement; the operation receives its rows (empty if none),
    as `rows` builds them (else tuples, as psycopg returns them)."""

    query: Statement
    params: Params = None
    rows: Shape[Any] | None = None
    # The operation's only statement: in a transaction of its own
    # (`transact`) it runs as its own implicit transaction, which spares
    # BEGIN and COMMIT their round trip.
    alone: bool = False


@dataclass(frozen=True)
class Send:
    """Run one statement whose result the operation does not read (a
    SAVEPOINT, say); the operation receives an empty list. At the start of a
    transaction of its own (`transact`) it travels with BEGIN and the next
    statement, in one round trip."""

    query: Statement
    params: Params = None


@dataclass(frozen=True)
class Copy:
    """COPY rows into the server in binary (`COPY ... FROM STDIN (FORMAT BINARY)`),
    `types` naming each column's type (name a json column "text" to send JSON
    text as it is: json's binary form is its text)."""

    query: str
    rows: Iterable[Sequence[Any]]
    types: Sequence[str]


Step: TypeAlias = Execute | Send | Copy
Op: TypeAlias = Generator[Step, list[Any], T]


def select(statement: Statement, params: Params, rows: Shape[R]) -> Op[list[R]]:
    """The statement's rows, as `rows` builds them by column name."""
    found: list[R] = yield Execute(statement, params, rows)
    return found


def first(statement: Statement, params: Params, rows: Shape[R]) -> Op[R | None]:
    """The statement's first row (None: it has none)."""
    found = yield from select(statement, params, rows)
    return next(iter(found), None)


def values(statement: Statement, params: Params = None) -> Op[list[Any]]:
    """The values of the statement's only column."""
    return select(statement, params, ONLY)


def value(statement: Statement, params: Params = None) -> Op[Any]:
    """The value of the statement's one row and only column."""
    (found,) = yield from select(statement, params, ONLY)
    return found


def _columns(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> list[str] | None:
    """The names of the result's columns; None when it has none. Read off the
    result: `cursor.description` builds an object per column, about 15 µs a
    statement of 11 columns, on every claim."""
    result = cur.pgresult
    if result is None or not result.nfields:
        return None
    return [(result.fname(i) or b"").decode() for i in range(result.nfields)]


def _built(step: Execute, columns: list[str], rows: list[Row]) -> list[Any]:
    if step.rows is None:
        return rows
    return step.rows.build(columns, rows)


# Results come in binary: uuids and timestamps cost the client less CPU to
# read than in text.
def run(conn: psycopg.Connection[Any], op: Op[T]) -> T:
    """Drives an operation on a sync connection, inside the caller's transaction."""
    return drive(op, lambda step: _execute(conn, step, None))


async def arun(conn: psycopg.AsyncConnection[Any], op: Op[T]) -> T:
    """Drives an operation on an async connection, inside the caller's transaction."""
    return await adrive(op, lambda step: _aexecute(conn, step, None))


class _Ahead:
    """The start of a transaction, in pipeline mode: BEGIN and the statements
    sent until the first result is read go in one round trip. Left (`close`:
    a sync that receives every result) at that first result or before the
    first COPY, which a pipeline cannot carry; the transaction goes on
    outside it."""

    def __init__(self, pipeline: AbstractContextManager[Any]) -> None:
        self._pipeline: AbstractContextManager[Any] | None = pipeline
        pipeline.__enter__()

    def close(self, error: BaseException | None = None) -> None:
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            pipeline.__exit__(type(error) if error else None, error, None)


class _AsyncAhead:
    """`_Ahead` on an async connection."""

    def __init__(self, pipeline: AbstractAsyncContextManager[Any]) -> None:
        self._pipeline: AbstractAsyncContextManager[Any] | None = pipeline

    @classmethod
    async def open(cls, conn: psycopg.AsyncConnection[Any]) -> _AsyncAhead:
        pipeline = conn.pipeline()
        await pipeline.__aenter__()
        return cls(pipeline)

    async def close(self, error: BaseException | None = None) -> None:
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            await pipeline.__aexit__(type(error) if error else None, error, None)


def _execute(conn: psycopg.Connection[Any], step: Step, ahead: _Ahead | None) -> list[Any]:
    with conn.cursor(binary=True) as cur:
        if isinstance(step, Copy):
            if ahead is not None:
                ahead.close()
            with cur.copy(step.query) as copy:
                copy.set_types(step.types)
                for row in step.rows:
                    copy.write_row(row)
            return []
        try:
            cur.execute(step.query, step.params)
        except BaseException as exc:
            # An earlier statement's failure can surface here: the pipeline
            # is left before the operation sees it, as it may go on.
            if ahead is not None:
                ahead.close(exc)
            raise
        if isinstance(step, Send):
            return []
        if ahead is not None:
            ahead.close()
        columns = _columns(cur)
        return [] if columns is None else _built(step, columns, cur.fetchall())


async def _aexecute(
    conn: psycopg.AsyncConnection[Any], step: Step, ahead: _AsyncAhead | None
) -> list[Any]:
    async with conn.cursor(binary=True) as cur:
        if isinstance(step, Copy):
            if ahead is not None:
                await ahead.close()
            async with cur.copy(step.query) as copy:
                copy.set_types(step.types)
                for row in step.rows:
                    await copy.write_row(row)
            return []
        try:
            await cur.execute(step.query, step.params)
        except BaseException as exc:
            if ahead is not None:
                await ahead.close(exc)
            raise
        if isinstance(step, Send):
            return []
        if ahead is not None:
            await ahead.close()
        columns = _columns(cur)
        return [] if columns is None else _built(step, columns, await cur.fetchall())


def transact(conn: psycopg.Connection[Any], op: Op[T]) -> T:
    """Runs an operation in a transaction of its own (a savepoint if one is
    open). BEGIN goes with the operation's first statements (`_Ahead`), or is
    not needed (`Execute.alone`)."""
    if conn.info.transaction_status != TransactionStatus.IDLE:
        with conn.transaction():
            return run(conn, op)
    first, op = _first_step(op)
    if _alone(first, conn.autocommit):
        return drive(op, _only_one(lambda step: _execute(conn, step, None)))
    ahead = _Ahead(conn.pipeline())
    tx = psycopg.Transaction(conn)
    try:
        tx.__enter__()
        result = drive(op, lambda step: _execute(conn, step, ahead))
        ahead.close()  # an operation of Sends only: their results, errors included
    except BaseException as exc:
        ahead.close(exc)
        if tx.status is tx.Status.ACTIVE:
            tx.__exit__(type(exc), exc, exc.__traceback__)
        raise
    tx.__exit__(None, None, None)
    return result


async def atransact(conn: psycopg.AsyncConnection[Any], op: Op[T]) -> T:
    if conn.info.transaction_status != TransactionStatus.IDLE:
        async with conn.transaction():
            return await arun(conn, op)
    first, op = _first_step(op)
    if _alone(first, conn.autocommit):
        return await adrive(op, _only_one(lambda step: _aexecute(conn, step, None)))
    ahead = await _AsyncAhead.open(conn)
    tx = psycopg.AsyncTransaction(conn)
    try:
        await tx.__aenter__()
        result = await adrive(op, lambda step: _aexecute(conn, step, ahead))
        await ahead.close()
    except BaseException as exc:
        await ahead.close(exc)
        if tx.status is tx.Status.ACTIVE:
            await tx.__aexit__(type(exc), exc, exc.__traceback__)
        raise
    await tx.__aexit__(None, None, None)
    return result


def _first_step(op: Op[T]) -> tuple[Step | None, Op[T]]:
    """The operation's first step (None: it has none), and the operation
    with that step still to come."""
    try:
        first = next(op)
    except StopIteration as stop:
        return None, _returning(stop.value)
    return first, _resumed(first, op)


def _returning(value: T) -> Op[T]:
    return value
    yield  # a generator that returns at once


def _resumed(first: Step, op: Op[T]) -> Op[T]:
    step = first
    while True:
        try:
            reply = yield step
        except Exception as exc:
            try:
                step = op.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
        else:
            try:
                step = op.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]


def _alone(first: Step | None, autocommit: bool) -> bool:
    """Whether the operation is one statement that may run as its own
    implicit transaction (only without an open transaction: autocommit)."""
    return first is None or (isinstance(first, Execute) and first.alone and autocommit)


def _only_one(execute: Callable[[Step], R]) -> Callable[[Step], R]:
    ran = False

    def once(step: Step) -> R:
        nonlocal ran
        if ran:
            raise RuntimeError("an operation went on after the statement it marked `alone`")
        ran = True
        return execute(step)

    return once


def connect(
    url: str,
    purpose: Purpose = "claims",
    *,
    synchronous_commit: bool = True,
    pooled: bool = False,
    **overrides: Any,
) -> psycopg.Connection[Any]:
    """A connection to `url` made as rota's own are (rota.core.connections,
    with the default settings): rota's session settings, the network's
    bounds. For code that holds a URL; rota's own processes connect from
    their Settings. `synchronous_commit=False`: claims and reports do not
    wait for the WAL flush (as workers' may, Settings.worker_synchronous_commit).
    `pooled`: the URL goes through a pooler in transaction mode."""
    settings = connections.at(url, pooled=pooled, synchronous_commit=synchronous_commit)
    return connections.connect(settings, purpose, **overrides)


async def aconnect(
    url: str,
    purpose: Purpose = "claims",
    *,
    synchronous_commit: bool = True,
    pooled: bool = False,
    **overrides: Any,
) -> psycopg.AsyncConnection[Any]:
    """`connect`, for asyncio."""
    settings = connections.at(url, pooled=pooled, synchronous_commit=synchronous_commit)
    return await connections.aconnect(settings, purpose, **overrides)
