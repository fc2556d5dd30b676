"""The public API around a task: `rota.context()` in and out of a run, the app
as a context manager, what a Task keeps of its function, and what `using`
and `prepare` accept (under rota.testing: no server)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import rota
from rota.producer.clients import AsyncProducer, Producer
from rota.settings import Settings
from rota.testing import InMemory


def new_settings() -> Settings:
    return Settings(
        database_url="postgresql://u:pw@db.invalid/app",
        redis_url="redis://redis.invalid:6379/0",
    )


@pytest.fixture
def app() -> rota.App:
    return rota.App(new_settings())


@pytest.fixture
def queue(app: rota.App) -> Iterator[InMemory]:
    with InMemory(app) as memory:
        yield memory


def test_context_gives_the_runs_id_tenant_and_attempt(queue: InMemory, app: rota.App) -> None:
    seen: list[rota.TaskContext] = []

    @app.task(queue="mail", max_attempts=3, backoff=0)
    def flaky(to: str) -> None:
        seen.append(rota.context())
        if len(seen) == 1:
            raise ConnectionError("smtp down")

    task_id = flaky.using(tenant="acme").enqueue("a@example.com")
    assert queue.run_all().succeeded == 1  # backoff 0: the retry runs at once
    (record,) = queue.done()
    assert [(c.id, c.tenant, c.attempt) for c in seen] == [
        (task_id, "acme", 1),
        (task_id, "acme", 2),
    ]
    for context in seen:
        assert (context.name, context.queue, context.max_attempts) == ("flaky", "mail", 3)
        assert context.enqueued_at == record.enqueued_at
        assert context.lease_expires_at > context.enqueued_at
    assert [c.is_last_attempt for c in seen] == [False, False]


def test_context_in_an_async_task_and_its_threads(queue: InMemory, app: rota.App) -> None:
    seen: list[tuple[str, int]] = []

    @app.task(max_attempts=1)
    async def notify(user: str) -> None:
        await asyncio.sleep(0)
        seen.append((rota.context().tenant, rota.context().attempt))
        # A thread started with the task's context sees it too.
        context = contextvars.copy_context()
        thread = threading.Thread(
            target=context.run, args=(lambda: seen.append((rota.context().tenant, 0)),)
        )
        thread.start()
        thread.join()
        assert rota.context().is_last_attempt

    task_id = notify.using(tenant="bob").enqueue("b")
    assert queue.run_all().succeeded == 1
    assert seen == [("bob", 1), ("bob", 0)]
    assert queue.get(task_id) is not None


def test_context_outside_a_task_raises_outside_task(queue: InMemory, app: rota.App) -> None:
    with pytest.raises(rota.OutsideTask, match="outside a running task"):
        rota.context()
    assert issubclass(rota.OutsideTask, rota.RotaError)

    @app.task
    def job() -> None: ...

    job.using(tenant="t").enqueue()
    assert queue.run_all().succeeded == 1
    with pytest.raises(rota.OutsideTask):
        rota.context()  # not left set once the run is over
    with pytest.raises(rota.OutsideTask):
        asyncio.run(_context_in_a_coroutine())


async def _context_in_a_coroutine() -> rota.TaskContext:
    return rota.context()


class _Closes:
    """Counts the producers' closes (the app's close closes them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sync = 0
        self.async_ = 0
        close, aclose = Producer.close, AsyncProducer.close

        def counted(producer: Producer) -> None:
            self.sync += 1
            close(producer)

        async def acounted(producer: AsyncProducer) -> None:
            self.async_ += 1
            await aclose(producer)

        monkeypatch.setattr(Producer, "close", counted)
        monkeypatch.setattr(AsyncProducer, "close", acounted)


def test_with_app_closes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    closes = _Closes(monkeypatch)
    with rota.App(new_settings()) as app:
        assert isinstance(app, rota.App)
        assert isinstance(app.producer, Producer)  # made, not connected
        assert closes.sync == 0
    assert closes.sync == 1

    with pytest.raises(ValueError, match="in the block"), rota.App(new_settings()) as app:
        app.producer  # noqa: B018
        raise ValueError("in the block")  # closed, and the error goes on
    assert closes.sync == 2


def test_async_with_app_closes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    closes = _Closes(monkeypatch)

    async def scenario() -> None:
        async with rota.App(new_settings()) as app:
            assert isinstance(app, rota.App)
            assert isinstance(app.aproducer, AsyncProducer)
            assert isinstance(app.producer, Producer)
            assert (closes.sync, closes.async_) == (0, 0)
        assert (closes.sync, closes.async_) == (1, 1)  # both producers

        with pytest.raises(KeyError):
            async with rota.App(new_settings()) as app:
                app.aproducer  # noqa: B018
                raise KeyError("in the block")
        assert closes.async_ == 2

    asyncio.run(scenario())


def test_a_task_keeps_its_functions_identity(app: rota.App) -> None:
    def parse_pdf(path: str, pages: int = 1) -> int:
        """Parses a PDF."""
        return pages

    task = app.task(queue="pdfs")(parse_pdf)
    assert task.__name__ == "parse_pdf"
    assert task.__qualname__ == parse_pdf.__qualname__
    assert task.__doc__ == "Parses a PDF."
    assert task.__wrapped__ is parse_pdf
    assert task.__module__ == __name__ == parse_pdf.__module__
    assert task("a.pdf", pages=3) == 3  # calling it runs the function here and now

    @app.task
    async def undocumented() -> None: ...

    assert undocumented.__name__ == "undocumented" and undocumented.__doc__ is None
    assert undocumented.__module__ == __name__


def test_prepare_refuses_a_connection(queue: InMemory, app: rota.App) -> None:
    @app.task
    def job(n: int) -> None: ...

    in_a_transaction = job.using(tenant="t", connection=object())
    with pytest.raises(rota.ValidationError, match="enqueue_many"):
        in_a_transaction.prepare(1)
    assert queue.tasks() == []
    in_a_transaction.enqueue(1)  # enqueue takes it (stored as if committed here)
    assert [t.args for t in queue.waiting()] == [[1]]


def test_a_parameter_named_like_an_option_gets_its_argument(queue: InMemory, app: rota.App) -> None:
    got: list[Any] = []

    @app.task
    def f(tenant: str, cost: int = 0, *, priority: str = "") -> None:
        got.append((tenant, cost, priority, rota.context().tenant))

    f.using(tenant="a", cost=2, priority=3).enqueue(tenant="x")
    f.using(tenant="b").enqueue("y", 5, priority="high")
    (first, second) = queue.waiting()
    assert (first.tenant, first.cost, first.priority, first.kwargs) == (
        "a",
        2.0,
        3,
        {"tenant": "x"},
    )
    assert (second.tenant, second.cost, second.args) == ("b", 1.0, ["y", 5])
    assert queue.run_all().succeeded == 2
    assert sorted(got) == [("x", 0, "", "a"), ("y", 5, "high", "b")]


def test_an_enqueue_by_name_refuses_an_unknown_option_or_no_tenant() -> None:
    app = rota.App()
    assert app.prepare("x.y", queue="q", tenant="a").tenant == "a"
    with pytest.raises(TypeError, match="not colour"):
        app.prepare("x.y", tenant="a", colour="red")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="tenant \\(required\\)"):
        app.prepare("x.y", queue="q")  # type: ignore[call-arg]
