"""rota.contrib.sqlalchemy against the real PostgreSQL and Redis: tasks in a
Session's transaction (stored if it commits, gone if it or its savepoint
rolls back) and after its commit (`enqueue_after_commit`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis
from sqlalchemy import Engine, String, create_engine, select
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    scoped_session,
    sessionmaker,
)

from rota import App, EnqueueError, Settings, core
from rota.buffer.streams import all_streams
from rota.contrib.connections import DifferentDatabase
from rota.contrib.sqlalchemy import aenqueue, enqueue, enqueue_after_commit
from rota.core import db
from rota.loader import Loader


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(100))


class Boom(Exception):
    pass


def _sqlalchemy_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(_sqlalchemy_url(database_url))
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def _states(url: str, ids: list[Any]) -> dict[Any, str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return dict(db.run(conn, core.task_states(ids)))


def _buffered(settings: Settings) -> int:
    with redis.Redis.from_url(settings.redis_url) as client:
        return sum(
            int(client.xlen(s)) for s in all_streams(settings.stream_prefix, settings.shards)
        )


def _items(engine: Engine) -> list[str]:
    with Session(engine) as session:
        return list(session.scalars(select(Order.item).order_by(Order.item)))


def test_an_enqueue_in_a_session_commits_and_rolls_back_with_it(
    app: App, engine: Engine, database_url: str, settings: Settings
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    with Session(engine) as session:
        session.add(Order(item="book"))
        kept = enqueue(session, parse_pdf.using(tenant="alice").prepare("a.pdf"))
        assert _states(database_url, [kept]) == {}  # not before the commit
        session.commit()
        session.add(Order(item="lamp"))
        dropped = enqueue(session, parse_pdf.using(tenant="alice").prepare("b.pdf"))
        session.rollback()
        with session.begin():
            kept_too = enqueue(session, parse_pdf.using(tenant="alice").prepare("c.pdf"))
            by_name = enqueue(session, app.prepare("parse_pdf", ["e.pdf"], tenant="alice"), app=app)
            with pytest.raises(Boom), session.begin_nested():  # a savepoint
                dropped_too = enqueue(session, parse_pdf.using(tenant="alice").prepare("d.pdf"))
                raise Boom
    ids = [kept, dropped, kept_too, dropped_too, by_name]
    assert set(_states(database_url, ids)) == {kept, kept_too, by_name}
    assert _items(engine) == ["book"]
    assert _buffered(settings) == 0  # straight into PostgreSQL, with the rows


def test_enqueue_after_commit_waits_for_the_commit(
    app: App, engine: Engine, database_url: str, settings: Settings
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    with Session(engine) as session:
        session.add(Order(item="pen"))
        first = enqueue_after_commit(session, parse_pdf.using(tenant="alice").prepare("a.pdf"))
        session.flush()
        assert _buffered(settings) == 0
        session.commit()
        assert _buffered(settings) == 1

        session.add(Order(item="ink"))
        b = enqueue_after_commit(session, parse_pdf.using(tenant="alice").prepare("b.pdf"))
        session.rollback()
        assert _buffered(settings) == 1

        with session.begin():
            c = enqueue_after_commit(session, parse_pdf.using(tenant="alice").prepare("c.pdf"))
            with pytest.raises(Boom), session.begin_nested():
                d = enqueue_after_commit(session, parse_pdf.using(tenant="alice").prepare("d.pdf"))
                raise Boom
            with session.begin_nested():  # released: its task waits for the outer commit
                e = enqueue_after_commit(session, parse_pdf.using(tenant="alice").prepare("e.pdf"))
            assert _buffered(settings) == 1
        assert _buffered(settings) == 3  # c and e

        f = enqueue_after_commit(session, parse_pdf.using(tenant="alice").prepare("f.pdf"))
    assert _buffered(settings) == 3  # closed without a commit: nothing
    assert _items(engine) == ["pen"]
    # Bad arguments fail where the task is asked for, not at the commit.
    with Session(engine) as session, pytest.raises(ValueError):
        enqueue_after_commit(session, parse_pdf.using(tenant="alice").prepare())
    # The ids returned are the ones the committed tasks were stored under.
    loader = Loader(settings)
    assert loader.drain().drained
    loader.close()
    assert set(_states(database_url, [first, b, c, d, e, f])) == {first, c, e}


def test_a_failed_enqueue_after_the_commit_is_raised_from_commit(engine: Engine) -> None:
    nowhere = App(
        Settings(
            database_url="postgresql://127.0.0.1:1/none",
            redis_url="redis://127.0.0.1:1/0",
            redis_retries=0,
        )
    )

    @nowhere.task
    def notify(order_id: int) -> None: ...

    with Session(engine) as session:
        session.add(Order(item="cup"))
        enqueue_after_commit(session, notify.using(tenant="alice").prepare(1))
        with pytest.raises(EnqueueError):
            session.commit()
        # The rows are committed, and the session goes on.
        session.add(Order(item="mug"))
        session.commit()
    assert _items(engine) == ["cup", "mug"]
    nowhere.close()


def test_a_session_on_another_database_is_refused(
    app: App, engine: Engine, empty_database_url: str
) -> None:
    other = create_engine(_sqlalchemy_url(empty_database_url))
    with Session(other) as session, pytest.raises(DifferentDatabase):
        enqueue(session, app.tasks["parse_pdf"].using(tenant="alice").prepare("a.pdf"))
    other.dispose()


def test_aenqueue_in_an_async_session(app: App, engine: Engine, database_url: str) -> None:
    parse_pdf = app.tasks["parse_pdf"]

    async def scenario() -> tuple[Any, Any]:
        aengine = create_async_engine(_sqlalchemy_url(database_url))
        try:
            async with AsyncSession(aengine) as session:
                session.add(Order(item="map"))
                kept = await aenqueue(session, parse_pdf.using(tenant="alice").prepare("a.pdf"))
                await session.commit()
                dropped = await aenqueue(session, parse_pdf.using(tenant="alice").prepare("b.pdf"))
                await session.rollback()
            return kept, dropped
        finally:
            await aengine.dispose()
            await app.aclose()

    kept, dropped = asyncio.run(scenario())
    assert set(_states(database_url, [kept, dropped])) == {kept}
    assert _items(engine) == ["map"]


def test_a_scoped_session_as_flask_sqlalchemy_has_it(
    app: App, engine: Engine, settings: Settings
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    session = scoped_session(sessionmaker(engine))
    session.add(Order(item="cap"))
    session.flush()
    enqueue_after_commit(session, parse_pdf.using(tenant="alice").prepare("a.pdf"))
    assert _buffered(settings) == 0
    session.commit()
    assert _buffered(settings) == 1
    enqueue_after_commit(session, parse_pdf.using(tenant="alice").prepare("b.pdf"))
    session.remove()  # the request's teardown, uncommitted
    assert _buffered(settings) == 1
    assert _items(engine) == ["cap"]
