"""The producer's capacity cache: refreshed beside the enqueues, never before
them, so that PostgreSQL stalled or down costs no enqueue a round trip."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

import fakeredis
import pytest

from rota import App, Settings
from rota.producer.clients import AsyncProducer, Producer
from rota.producer.core import (
    Effect,
    FetchBacklogs,
    ProducerCore,
    ReadBufferBacklogs,
    RefreshInBackground,
    WriteBuffer,
)
from tests.helpers import wait_for


def _start(core: ProducerCore, flow: Any) -> RefreshInBackground:
    """Drives an enqueue's flow to the refresh it starts."""
    assert isinstance(next(flow), ReadBufferBacklogs)
    refresh = flow.send({})
    assert isinstance(refresh, RefreshInBackground)
    return refresh


def _fail(refresh: RefreshInBackground) -> None:
    assert isinstance(next(refresh.flow), FetchBacklogs)
    with pytest.raises(StopIteration):
        refresh.flow.throw(ConnectionError("database down"))


def test_a_failed_refresh_is_not_retried_before_the_cache_is_due(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(capacity_cache_seconds=30)
    app = App(settings)
    batch = app.batch([app.prepare("x.y", queue="q", tenant="alice")])
    core = ProducerCore(settings)

    first = core.store(batch)
    refresh = _start(core, first)
    with caplog.at_level(logging.WARNING):
        _fail(refresh)
    assert isinstance(first.send(None), WriteBuffer)  # failed: nothing left to wait for
    first.close()
    assert core.refreshing is None

    second = core.store(batch)
    assert isinstance(next(second), WriteBuffer)  # straight to the buffer
    second.close()
    assert [r.message for r in caplog.records if "capacities" in r.message] == [
        "could not refresh tenant capacities, using the cached ones for 30.0 s: database down"
    ]


def test_the_refresh_is_tried_again_once_due() -> None:
    settings = Settings(capacity_cache_seconds=0)
    app = App(settings)
    batch = app.batch([app.prepare("x.y", queue="q", tenant="alice")])
    core = ProducerCore(settings)
    core.capacity.refresh({"alice": (5, 0.0)})
    for _ in range(2):
        flow = core.store(batch)
        _fail(_start(core, flow))
        assert isinstance(flow.send(None), WriteBuffer)
        flow.close()


def _batch(app: App, tenant: str = "alice") -> Any:
    return app.batch([app.prepare("x.y", queue="q", tenant=tenant)])


def test_the_sync_producers_enqueues_go_on_while_its_refresh_hangs() -> None:
    settings = Settings(capacity_cache_seconds=0, redis_retries=0)
    app = App(settings)
    producer = Producer(settings)
    producer._redis = fakeredis.FakeRedis(server=fakeredis.FakeServer())  # type: ignore[assignment]
    producer.core.capacity.refresh({})  # known: the first refresh's wait is another test's
    released = threading.Event()
    asked: list[str] = []

    def stalled(effect: Effect) -> Any:  # PostgreSQL stopped: the read hangs until released
        assert isinstance(effect, FetchBacklogs)
        asked.append(threading.current_thread().name)
        released.wait(60)
        return {"alice": (1, 0.0)}

    producer._carry_out_refresh = stalled  # type: ignore[method-assign]
    try:
        for _ in range(5):  # each finds the cache stale; each returns
            producer.store(_batch(app))
        wait_for(lambda: asked, what="the refresh's read")
        producer.store(_batch(app))
        assert asked == ["rota-capacity-refresh"]  # one, in its own thread
        producer.close()  # does not wait for it
    finally:
        released.set()
    wait_for(lambda: producer.core.refreshing is None, what="the refresh to land")
    assert producer.core.capacity.limits == {"alice": (1, 0.0)}


def test_the_async_producers_enqueues_go_on_while_its_refresh_hangs() -> None:
    settings = Settings(capacity_cache_seconds=0, redis_retries=0)
    app = App(settings)

    async def main() -> AsyncProducer:
        producer = AsyncProducer(settings)
        producer._redis = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())  # type: ignore[assignment]
        producer.core.capacity.refresh({})
        asked: list[int] = []

        async def stalled(effect: Effect) -> Any:
            assert isinstance(effect, FetchBacklogs)
            asked.append(1)
            await asyncio.Event().wait()  # never answered

        producer._carry_out_refresh = stalled  # type: ignore[method-assign]
        for _ in range(5):
            await producer.store(_batch(app))
        while not asked:
            await asyncio.sleep(0.01)
        await producer.store(_batch(app))
        assert asked == [1]
        await asyncio.wait_for(producer.close(), 5)  # cancels it, does not wait on it
        await asyncio.sleep(0)
        return producer

    producer = asyncio.run(main())
    assert producer.core.refreshing is None  # the next enqueue may start one


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_forked_child_refreshes_on_its_own() -> None:
    settings = Settings(capacity_cache_seconds=0)
    app = App(settings)
    core = ProducerCore(settings)
    core.capacity.refresh({"alice": (5, 0.0)})
    _start(core, core.store(_batch(app)))  # under way in the parent, and never ending
    pid = os.fork()
    if pid == 0:  # the child: the parent's refresh thread is not here
        code = 1
        try:
            if core.refreshing is None:
                _start(core, core.store(_batch(app)))
                code = 0 if core.refreshing is not None else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    flow = core.store(_batch(app))
    assert isinstance(next(flow), WriteBuffer)  # the parent's still under way: no other
