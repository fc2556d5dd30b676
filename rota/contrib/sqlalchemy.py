"""rota in a SQLAlchemy (2.x, `postgresql+psycopg`) Session's transaction.

    from rota.contrib.sqlalchemy import enqueue, enqueue_after_commit

    with Session(engine) as session, session.begin():
        session.add(order)
        receipt = send_receipt.using(tenant="acme").prepare(order.id)
        enqueue(session, receipt)               # in this transaction
        enqueue_after_commit(session, receipt)  # after it commits (one or the other)

`aenqueue(async_session, ...)` is `enqueue` for an AsyncSession. After an
AsyncSession's commit, enqueue as usual: `await session.commit()`, then
`await task.using(...).aenqueue(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg
from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction, scoped_session

from rota.app import App
from rota.buffer.entries import TaskBatch
from rota.contrib.connections import (
    DifferentDatabase,
    aserver_cursors,
    check_same_database,
    server_cursors,
)
from rota.task import TaskCall

if TYPE_CHECKING:  # asyncio support needs greenlet (sqlalchemy[asyncio]); sync use does not
    from sqlalchemy.ext.asyncio import AsyncSession

__all__ = ["DifferentDatabase", "aenqueue", "enqueue", "enqueue_after_commit"]

SessionLike = Session | scoped_session[Session]
_PENDING = "rota.after_commit"  # the key of a session's pending tasks in Session.info


def _app_of(call: TaskCall, app: App | None) -> App:
    """The app a run is enqueued through: given, or its task's."""
    if app is not None:
        return app
    if call.task is None or not isinstance(call.task.app, App):
        raise TypeError(f"task {call.name!r} belongs to no rota.App here: pass app=")
    return call.task.app


def _driver_connection(dbapi: Any, app: App) -> Any:
    raw = dbapi.driver_connection
    if not isinstance(raw, psycopg.Connection | psycopg.AsyncConnection):
        raise TypeError(
            f"rota enqueues through psycopg 3 ('postgresql+psycopg://' URLs), not {type(raw)}"
        )
    check_same_database(raw.info, app.settings.database_url, "the session's database")
    return raw


def enqueue(session: SessionLike, call: TaskCall, *, app: App | None = None) -> UUID:
    """Enqueues a run (`task.using(tenant=...).prepare(...)`) in the
    session's transaction (begun if need be): the task is stored if it
    commits, gone if it rolls back (a savepoint's rollback included). `app`:
    for a run made by name (`app.prepare`)."""
    app = _app_of(call, app)
    raw = _driver_connection(session.connection().connection, app)
    with server_cursors(raw):
        return app.enqueue_many([call], connection=raw)[0]


async def aenqueue(session: AsyncSession, call: TaskCall, *, app: App | None = None) -> UUID:
    """`enqueue` for an AsyncSession (a `postgresql+psycopg` async engine)."""
    app = _app_of(call, app)
    connection = await session.connection()
    raw = _driver_connection(await connection.get_raw_connection(), app)
    async with aserver_cursors(raw):
        return (await app.aenqueue_many([call], connection=raw))[0]


@dataclass
class _Pending:
    app: App
    batch: TaskBatch
    within: SessionTransaction | None  # the innermost transaction it was asked in


def enqueue_after_commit(session: SessionLike, call: TaskCall, *, app: App | None = None) -> UUID:
    """Enqueues once the session's transaction commits, through the app's
    producer (Redis, or PostgreSQL when Redis is down); nothing if it rolls
    back or is closed uncommitted, nor if the savepoint (`begin_nested`) it
    was asked in rolls back. The task is checked now (bad arguments raise
    here); the id returned is the one it gets if the transaction commits.

    Tasks are enqueued when the transaction has ended, in the order asked.
    If one fails (Redis and PostgreSQL both down: rota.EnqueueError; a full
    tenant: rota.CapacityExceeded), the rest are still tried, and then the
    first error is raised from `commit()`: the rows are committed, the
    failed tasks are not."""
    if isinstance(session, scoped_session):
        session = session()
    app = _app_of(call, app)
    batch = app.batch([call])
    within = session.get_nested_transaction() or session.get_transaction()
    session.info.setdefault(_PENDING, []).append(_Pending(app, batch, within))
    if not event.contains(session, "after_commit", _committed):
        event.listen(session, "after_commit", _committed)
        event.listen(session, "after_soft_rollback", _rolled_back)
        event.listen(session, "after_transaction_end", _ended)
    return batch.ids[0]


_READY = "rota.after_commit.ready"


def _committed(session: Session) -> None:
    # Fired for a savepoint's release too: only the outermost commit counts.
    if session.get_nested_transaction() is None:
        session.info[_READY] = session.info.pop(_PENDING, [])


def _boundary(transaction: SessionTransaction) -> SessionTransaction:
    """The transaction a rollback undid: the savepoint or root around it."""
    while not transaction.nested and transaction.parent is not None:
        transaction = transaction.parent
    return transaction


def _inside(transaction: SessionTransaction | None, outer: SessionTransaction) -> bool:
    while transaction is not None:
        if transaction is outer:
            return True
        transaction = transaction.parent
    return False


def _rolled_back(session: Session, previous_transaction: SessionTransaction) -> None:
    undone = _boundary(previous_transaction)
    pending: list[_Pending] = session.info.get(_PENDING, [])
    if undone.parent is None:
        pending.clear()
    else:
        pending[:] = [p for p in pending if not _inside(p.within, undone)]


def _ended(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is not None:
        return
    # The outermost transaction is over: what it did not commit is dropped
    # (a close without a commit rolls back), what it committed is enqueued.
    session.info.pop(_PENDING, None)
    ready: list[_Pending] = session.info.pop(_READY, [])
    errors: list[Exception] = []
    for pending in ready:
        try:
            pending.app.producer.store(pending.batch)
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
