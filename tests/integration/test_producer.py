"""The producer against real Redis and PostgreSQL: buffer, fallback, transactions."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import redis

from rota import App, CapacityExceeded, EnqueueError, Settings, UnknownTask, core
from rota.buffer.streams import all_streams
from rota.core import db
from rota.loader import Loader
from rota.producer.breaker import BreakerState
from rota_tools.devservers import Server, descendants, proc_stat
from tests.helpers import wait_for

Conn = psycopg.Connection[Any]


def _buffered(settings: Settings) -> int:
    client = redis.Redis.from_url(settings.redis_url)
    return sum(int(client.xlen(s)) for s in all_streams(settings.stream_prefix, settings.shards))


def _drain(settings: Settings) -> None:
    loader = Loader(settings)
    try:
        assert loader.drain().drained
    finally:
        loader.close()


def test_enqueue_writes_to_the_buffer_and_the_loader_makes_it_claimable(
    app: App, settings: Settings, conn: Conn
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    task_id = parse_pdf.using(tenant="alice").enqueue("a.pdf", pages=3)
    assert _buffered(settings) == 1
    _drain(settings)
    (task,) = db.run(conn, core.claim(["pdfs"], 10, "w"))
    assert task.id == task_id
    assert (task.name, task.tenant, task.args, task.kwargs) == (
        "parse_pdf",
        "alice",
        ["a.pdf"],
        {"pages": 3},
    )
    assert task.max_attempts == 2


def test_enqueue_by_name_and_many(app: App, settings: Settings, conn: Conn) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    ids = app.enqueue_many(
        [parse_pdf.using(tenant=f"t{i % 3}").prepare(f"{i}.pdf") for i in range(600)]
    )
    other = app.enqueue("mail.send", args=["x@y"], queue="mail", tenant="t1")
    assert len(set(ids)) == 600
    with pytest.raises(UnknownTask, match="queue="):
        app.enqueue("mail.send", tenant="t1")
    _drain(settings)
    counts = db.run(conn, core.queue_counts())
    assert counts["pdfs"]["ready"] == 600 and counts["mail"]["ready"] == 1
    assert db.run(conn, core.task_states([other]))[other].queue == "mail"


def test_a_tenants_tasks_keep_their_order_through_the_buffer(
    app: App, settings: Settings, conn: Conn
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    ids = [parse_pdf.using(tenant="alice").enqueue(f"{i}.pdf") for i in range(20)]
    _drain(settings)
    assert [t.id for t in db.run(conn, core.claim(["pdfs"], 100, "w"))] == ids


def test_idempotency_key_makes_a_retried_enqueue_one_task(
    app: App, settings: Settings, conn: Conn
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    first = parse_pdf.using(tenant="alice", idempotency_key="upload-42").enqueue("a.pdf")
    again = parse_pdf.using(tenant="alice", idempotency_key="upload-42").enqueue("a.pdf")
    assert first == again
    _drain(settings)
    assert db.run(conn, core.queue_counts())["pdfs"]["ready"] == 1


def test_eta_and_countdown(app: App, settings: Settings, conn: Conn) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    later = parse_pdf.using(tenant="alice", countdown=60).enqueue("a.pdf")
    at = parse_pdf.using(tenant="alice", eta=datetime.now(UTC) + timedelta(hours=1)).enqueue(
        "b.pdf"
    )
    with pytest.raises(rota_validation_error()):
        parse_pdf.using(tenant="alice", countdown=1, eta=datetime.now(UTC)).enqueue("c.pdf")
    _drain(settings)
    states = db.run(conn, core.task_states([later, at]))
    assert {s.status for s in states.values()} == {"scheduled"}


def rota_validation_error() -> type[Exception]:
    from rota import ValidationError

    return ValidationError


def test_bad_input_writes_nothing(app: App, settings: Settings) -> None:
    from rota import InvalidName, NotJSONSerializable, PayloadTooLarge, ValidationError

    parse_pdf = app.tasks["parse_pdf"]
    with pytest.raises(InvalidName):
        parse_pdf.using(tenant="bad tenant").enqueue("a.pdf")
    with pytest.raises(NotJSONSerializable):
        parse_pdf.using(tenant="alice").enqueue({1, 2})
    with pytest.raises(PayloadTooLarge):
        parse_pdf.using(tenant="alice").enqueue("x" * (settings.max_payload_bytes + 1))
    with pytest.raises(ValidationError):
        parse_pdf.using(tenant="alice", cost=-1).enqueue("a.pdf")
    with pytest.raises(InvalidName):
        app.enqueue("not a name!", queue="pdfs", tenant="alice")
    with pytest.raises(InvalidName):
        app.enqueue("x.y", queue="Bad Queue", tenant="alice")
    # One bad call in a batch: nothing of the batch is written.
    with pytest.raises(InvalidName):
        app.enqueue_many(
            [
                parse_pdf.using(tenant="ok").prepare("a.pdf"),
                parse_pdf.using(tenant="not ok").prepare("b.pdf"),
            ]
        )
    assert _buffered(settings) == 0


def test_transactional_enqueue_commits_and_rolls_back_with_the_caller(
    app: App, database_url: str
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    with psycopg.connect(database_url) as conn:
        kept = parse_pdf.using(tenant="alice", connection=conn).enqueue("a.pdf")
        conn.commit()
        dropped = parse_pdf.using(tenant="alice", connection=conn).enqueue("b.pdf")
        dropped_too = parse_pdf.using(tenant="alice", connection=conn).enqueue("c.pdf")
        conn.rollback()
    with psycopg.connect(database_url, autocommit=True) as check:
        states = db.run(check, core.task_states([kept, dropped, dropped_too]))
    assert set(states) == {kept}


def test_redis_down_falls_back_to_postgres_and_the_breaker_opens(
    database_url: str, conn: Conn
) -> None:
    settings = Settings(
        database_url=database_url,
        redis_url="redis://127.0.0.1:1/0",
        redis_retries=1,
        breaker_failures=2,
        breaker_reset_seconds=60,
    )
    app = App(settings)
    ids = [app.enqueue("x.y", queue="q", tenant="alice") for _ in range(5)]
    assert app._core.breaker.state is BreakerState.OPEN
    assert app._core.fallbacks == 5
    assert db.run(conn, core.queue_counts())["q"]["ready"] == 5
    assert set(db.run(conn, core.task_states(ids))) == set(ids)
    app.close()


def test_both_down_raises_and_reports_nothing_stored() -> None:
    settings = Settings(
        database_url="postgresql://rota@127.0.0.1:1/none",
        redis_url="redis://127.0.0.1:1/0",
        redis_retries=0,
        database_timeout_seconds=1,
    )
    app = App(settings)
    with pytest.raises(EnqueueError, match="not stored"):
        app.enqueue("x.y", queue="q", tenant="alice")
    with pytest.raises(EnqueueError):
        asyncio.run(app.aenqueue("x.y", queue="q", tenant="alice"))
    app.close()


def test_capacity_gives_backpressure(settings: Settings, conn: Conn) -> None:
    db.transact(conn, core.configure_tenant("small", capacity=5))
    # Decided from a cache (one query per 30 s here) plus what this process
    # enqueued since: no database round trip per call.
    app = App(settings.model_copy(update={"capacity_cache_seconds": 30}))
    parse_pdf = app.task(lambda path: None, name="parse_pdf")
    app.enqueue_many([parse_pdf.using(tenant="small").prepare("a") for _ in range(5)])
    with pytest.raises(CapacityExceeded) as refused:
        parse_pdf.using(tenant="small").enqueue("b")
    assert refused.value.capacity == 5
    parse_pdf.using(tenant="unlimited").enqueue("c")  # other tenants are not affected
    app.close()


@contextlib.contextmanager
def _stalled(server: Server, most: float) -> Iterator[threading.Event]:
    """Every process of `server` stopped (SIGSTOP: connections stay open,
    nothing answers) until the block ends or `most` seconds pass, whichever
    comes first; the event tells whether they were let go."""
    top = server.process.pid  # runuser, when the tests run as root, then the postmaster
    stopped: list[int] = []
    for pid in [top, *descendants(top)]:  # the parents first: none forks meanwhile
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
    resumed = threading.Event()
    lock = threading.Lock()

    def resume() -> None:
        with lock:
            if not resumed.is_set():
                for pid in reversed(stopped):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
                resumed.set()

    timer = threading.Timer(most, resume)
    timer.start()
    try:
        yield resumed
    finally:
        timer.cancel()
        resume()
        # A wrapper that saw its child stop stops itself: let go again.
        wait_for(lambda: all([_let_go(pid) for pid in stopped]), 10, "the server to run again")


def _let_go(pid: int) -> bool:
    """Whether `pid` runs (or is gone); SIGCONTs it if it is stopped."""
    fields = proc_stat(pid)
    if fields is not None and fields[0] == "T":
        os.kill(pid, signal.SIGCONT)
        return False
    return True


def test_enqueues_do_not_wait_for_a_stalled_postgresql(
    settings: Settings, conn: Conn, postgres_server: Server
) -> None:
    db.transact(conn, core.configure_tenant("small", capacity=5))
    # Capacities due every 0.2 s: several refreshes fall due within the stall.
    app = App(settings.model_copy(update={"capacity_cache_seconds": 0.2}))
    job = app.task(lambda n: None, name="job")
    try:
        job.using(tenant="small").enqueue(0)  # the process's first refresh: small's capacity
        with _stalled(postgres_server, most=30.0) as resumed:
            for n in range(3):
                job.using(tenant="small").enqueue(n)
            until = time.monotonic() + 1.0
            while time.monotonic() < until:
                job.using(tenant="big").enqueue(n)
            # Every enqueue returned with PostgreSQL stopped, not once it was back.
            assert not resumed.is_set()
            with pytest.raises(CapacityExceeded):  # small's 4 counted: 2 units more do not fit
                job.using(tenant="small", cost=2).enqueue(9)
            assert not resumed.is_set()
        # Back: the refresh under way lands, later ones read what PostgreSQL says.
        job.using(tenant="small").enqueue(4)
        with pytest.raises(CapacityExceeded):
            job.using(tenant="small").enqueue(5)
        db.transact(conn, core.patch_tenant("small", {"capacity": 7}, "test"))

        def accepted() -> bool:
            try:
                job.using(tenant="small").enqueue(6)
            except CapacityExceeded:
                return False
            return True

        wait_for(accepted, what="the raised capacity to be read")
        job.using(tenant="small").enqueue(7)
        with pytest.raises(CapacityExceeded):
            job.using(tenant="small").enqueue(8)
    finally:
        app.close()


def test_async_twins(app: App, settings: Settings, conn: Conn, database_url: str) -> None:
    parse_pdf = app.tasks["parse_pdf"]

    async def main() -> list[Any]:
        one = await parse_pdf.using(tenant="alice").aenqueue("a.pdf")
        two = await app.aenqueue("parse_pdf", args=["b.pdf"], tenant="bob")
        many = await app.aenqueue_many([parse_pdf.using(tenant="carol").prepare("c")] * 3)
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            in_tx = await parse_pdf.using(tenant="dave", connection=aconn).aenqueue("d.pdf")
            await aconn.commit()
        await app.aclose()
        return [one, two, *many, in_tx]

    ids = asyncio.run(main())
    _drain(settings)
    assert set(db.run(conn, core.task_states(ids))) == set(ids)
