"""rota.testing's in-memory queue: enqueues checked as in production, tasks run
in fair order with the worker's outcome rules, no server (the unit tier's
guard, tests/unit/conftest.py, fails any connection)."""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import rota
from rota.buffer import redis_client
from rota.consumer import current_task
from rota.core import db
from rota.errors import (
    CapacityExceeded,
    InvalidName,
    NotJSONSerializable,
    PayloadTooLarge,
    UnknownTask,
    ValidationError,
)
from rota.settings import Settings
from rota.testing import InMemory
from rota.testing.line import backoff_seconds

SCHEMA = (Path(rota.__file__).parent / "sql" / "schema.sql").read_text()


def new_app(**settings: Any) -> rota.App:
    return rota.App(
        Settings(
            database_url="postgresql://u:pw@db.invalid/app",
            redis_url="redis://redis.invalid:6379/0",
            **settings,
        )
    )


@pytest.fixture
def app() -> rota.App:
    return new_app()


@pytest.fixture
def queue(app: rota.App) -> Iterator[InMemory]:
    with InMemory(app) as memory:
        yield memory


def test_enqueues_go_to_memory_and_run(app: rota.App) -> None:
    sent: list[str] = []

    @app.task(queue="mail")
    def send_mail(to: str, subject: str = "hi") -> str:
        sent.append(f"{to}: {subject}")
        return "sent"

    with InMemory(app) as queue:
        task_id = send_mail.enqueue("a@example.com", tenant="acme", subject="welcome")
        assert len(queue.waiting(task="send_mail", tenant="acme")) == 1
        assert queue.waiting(tenant="other") == []
        (waiting,) = queue.waiting(task=send_mail, queue="mail")
        assert (waiting.id, waiting.args, waiting.kwargs) == (
            task_id,
            ["a@example.com"],
            {"subject": "welcome"},
        )
        assert (waiting.status, waiting.attempts, waiting.eta) == ("pending", 0, None)
        assert sent == []  # nothing runs until asked

        results = queue.run_all()
        assert (results.succeeded, results.failed, len(results)) == (1, 0, 1)
        assert sent == ["a@example.com: welcome"]
        (done,) = queue.done()
        assert (done.id, done.tenant, done.attempts, done.result) == (task_id, "acme", 1, "sent")
        assert queue.waiting() == [] and queue.run_all().runs == []


def test_the_app_is_given_back_its_producer_and_clock(app: rota.App) -> None:
    clock = app.clock
    with InMemory(app) as queue:
        assert app.producer is queue.producer and app.aproducer is queue.aproducer
        assert app.clock == queue.now
        with InMemory(app) as inner:  # nested: each gives back what it found
            assert app.producer is inner.producer
        assert app.producer is queue.producer
    assert (app._producer, app._aproducer, app._core, app.clock) == (None, None, None, clock)


def test_no_redis_or_postgresql_client_is_made(
    app: rota.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a server client was made")

    for module, name in [
        (redis_client, "connect"),
        (redis_client, "aconnect"),
        (db, "connect"),
        (db, "aconnect"),
    ]:
        monkeypatch.setattr(module, name, refuse)

    @app.task
    def child(n: int) -> None: ...

    @app.task
    async def parent(n: int) -> None:
        await child.aenqueue(n, tenant="t")

    with InMemory(app) as queue:
        parent.enqueue(1, tenant="t")
        app.enqueue_many([parent.call(n, tenant="t") for n in range(2, 600)])
        asyncio.run(parent.aenqueue(600, tenant="t"))
        child.enqueue(0, tenant="t", connection=object())  # stored as if committed
        assert queue.run_all().succeeded == 1201
        with pytest.raises(RuntimeError, match="no Redis"):
            queue.producer.redis  # noqa: B018
    app.close()


def test_connection_enqueues_are_stored(queue: InMemory, app: rota.App) -> None:
    @app.task
    def job() -> None: ...

    task_id = job.enqueue(tenant="t", connection=object())
    assert [t.id for t in queue.waiting()] == [task_id]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda task: task.call("x", tenant="bad tenant"), InvalidName),
        (lambda task: task.call(math.nan, tenant="t"), NotJSONSerializable),
        (lambda task: task.call({1, 2}, tenant="t"), NotJSONSerializable),
        (lambda task: task.call("x" * 300_000, tenant="t"), PayloadTooLarge),
        (lambda task: task.call("x", "y", "z", tenant="t"), ValidationError),  # signature
        (lambda task: task.call("x", tenant="t", countdown="5"), ValidationError),
        (
            lambda task: task.call("x", tenant="t", countdown=1, eta=datetime.now(UTC)),
            ValidationError,
        ),
        (lambda task: task.call("x", tenant="t", eta=datetime(2030, 1, 1)), ValidationError),
        (lambda task: task.call("x", tenant="t", cost=0), ValidationError),
        (lambda task: task.call("x", tenant="t", idempotency_key=""), ValidationError),
        (lambda task: task.call(2**64, tenant="t"), ValidationError),
        (lambda task: rota.TaskCall("nope", "t"), UnknownTask),
        (lambda task: rota.TaskCall("job", "t", kwargs={"tenant": "x"}), ValidationError),
        (lambda task: rota.TaskCall("job", "t", ["x"], queue="Bad Queue"), InvalidName),
    ],
)
def test_enqueues_are_refused_as_in_production(call: Any, error: type[Exception]) -> None:
    app = new_app()

    @app.task
    def job(path: str, pages: int = 1) -> None: ...

    with pytest.raises(error) as production:
        app.batch([call(job)])  # what every enqueue checks before its producer
    with InMemory(app) as queue:
        with pytest.raises(error) as in_memory:
            app.enqueue_many([call(job)])
        assert type(in_memory.value) is type(production.value)
        assert str(in_memory.value) == str(production.value)
        with pytest.raises(error):
            asyncio.run(app.aenqueue_many([job.call("ok", tenant="t"), call(job)]))
        assert queue.tasks() == []  # all or nothing


def test_an_allow_list_of_queues_holds() -> None:
    app = new_app(queues="mail")
    with pytest.raises(ValidationError, match="ROTA_QUEUES"):

        @app.task(queue="pdfs")
        def parse() -> None: ...

    with InMemory(app), pytest.raises(ValidationError, match="ROTA_QUEUES"):
        app.enqueue("elsewhere", queue="pdfs", tenant="t")


def test_idempotency_keys_deduplicate(queue: InMemory, app: rota.App) -> None:
    @app.task
    def charge(amount: int) -> None: ...

    first = charge.enqueue(5, tenant="acme", idempotency_key="order-1")
    again = charge.enqueue(7, tenant="acme", idempotency_key="order-1")
    other = charge.enqueue(5, tenant="bob", idempotency_key="order-1")  # per tenant
    assert first == again != other
    ids = app.enqueue_many([charge.call(1, tenant="c", idempotency_key="k")] * 3)
    assert len(set(ids)) == 1
    assert [t.args for t in queue.waiting(tenant="acme")] == [[5]]  # the first one's
    assert queue.run_all().succeeded == 3
    assert charge.enqueue(5, tenant="acme", idempotency_key="order-1") == first
    assert queue.waiting() == []  # a task that ran is not brought back


def test_eta_and_countdown_are_not_run_early(queue: InMemory, app: rota.App) -> None:
    @app.task
    def later(n: int) -> int:
        return n

    start = queue.now()
    later.enqueue(1, tenant="t", countdown=60)
    later.enqueue(2, tenant="t", eta=start + timedelta(hours=2))
    later.enqueue(3, tenant="t")
    assert [t.status for t in queue.waiting()] == ["scheduled", "scheduled", "pending"]
    assert [r.result for r in queue.run_all()] == [3]
    queue.advance(30)
    assert queue.run_all().runs == []
    queue.advance(timedelta(seconds=30))
    assert [r.result for r in queue.run_all()] == [1]
    with pytest.raises(ValueError, match="forward"):
        queue.advance(to=start)
    assert [r.result for r in queue.run_all(now=start + timedelta(hours=2))] == [2]
    assert queue.now() >= start + timedelta(hours=2)

    later.enqueue(4, tenant="t", countdown=10)  # from the clock as it is now
    (waiting,) = queue.waiting()
    assert waiting.eta is not None and waiting.eta - waiting.enqueued_at == timedelta(seconds=10)
    assert waiting.enqueued_at >= start + timedelta(hours=2)
    assert queue.run_all(advance=True).succeeded == 1  # runs what is scheduled, too


def test_a_failure_is_retried_after_its_backoff_then_succeeds(
    queue: InMemory, app: rota.App
) -> None:
    calls: list[int] = []

    @app.task(max_attempts=3, backoff=10)
    def flaky() -> str:
        calls.append(current_task.get().attempt)
        if len(calls) == 1:
            raise ConnectionError("smtp down")
        return "ok"

    flaky.enqueue(tenant="t")
    first = queue.run_all()
    assert (first.retried, first.succeeded) == (1, 0)
    assert first.runs[0].error == "ConnectionError: smtp down"
    (failed,) = queue.failed()
    assert (failed.status, failed.attempts, failed.error) == (
        "scheduled",
        1,
        "ConnectionError: smtp down",
    )
    assert failed.traceback is not None and "raise ConnectionError" in failed.traceback
    assert failed.run_at is not None
    assert timedelta(seconds=4.9) < failed.run_at - queue.now() <= timedelta(seconds=10)
    queue.advance(4.9)
    assert queue.run_all().runs == []  # backoff: 10 s, half of it jitter
    queue.advance(5.1)
    second = queue.run_all()
    assert (second.succeeded, calls) == (1, [1, 2])
    (done,) = queue.done()
    assert (done.attempts, done.result, done.error) == (2, "ok", "ConnectionError: smtp down")


def test_dead_after_max_attempts(queue: InMemory, app: rota.App) -> None:
    @app.task(max_attempts=3, backoff=1)
    def broken(n: int) -> None:
        raise ValueError(f"bad input {n}")

    broken.enqueue(7, tenant="t")
    results = queue.run_all(advance=True)
    assert [(r.attempt, r.outcome) for r in results] == [
        (1, "retried"),
        (2, "retried"),
        (3, "dead"),
    ]
    (dead,) = queue.dead()
    assert (dead.attempts, dead.error, dead.args) == (3, "ValueError: bad input 7", [7])
    assert dead.traceback is not None and "bad input 7" in dead.traceback
    assert queue.waiting() == queue.failed() == []


def test_retry_asks_for_its_countdown(queue: InMemory, app: rota.App) -> None:
    @app.task(max_attempts=2, backoff=0)
    def poll() -> None:
        if current_task.get().attempt == 1:
            raise rota.Retry(countdown=30, reason="not ready")

    poll.enqueue(tenant="t")
    assert queue.run_all().retried == 1
    (waiting,) = queue.failed()
    assert waiting.error == "not ready" and waiting.traceback is None
    queue.advance(29)
    assert queue.run_all().runs == []
    queue.advance(1)
    assert queue.run_all().succeeded == 1


def test_retry_out_of_bounds_and_the_last_attempt(queue: InMemory, app: rota.App) -> None:
    @app.task(max_attempts=2, backoff=0)
    def stubborn() -> None:
        raise rota.Retry(countdown=-1)

    stubborn.enqueue(tenant="t")
    results = queue.run_all()  # backoff 0: the second attempt runs at once
    assert [r.outcome for r in results] == ["retried", "dead"]
    assert "retried after the task's backoff instead" in (results.runs[0].error or "")
    assert queue.dead()[0].attempts == 2


def test_secrets_are_masked_in_stored_errors(queue: InMemory, app: rota.App) -> None:
    @app.task(max_attempts=1)
    def leaky() -> None:
        raise RuntimeError("cannot reach postgresql://rota:hunter2@db/app")

    leaky.enqueue(tenant="t")
    queue.run_all()
    (dead,) = queue.dead()
    assert "hunter2" not in (dead.error or "") + (dead.traceback or "")


def test_async_tasks_run_with_current_task(queue: InMemory, app: rota.App) -> None:
    seen: list[tuple[str, int]] = []

    @app.task
    async def notify(user: str) -> str:
        await asyncio.sleep(0)
        task = current_task.get()
        seen.append((task.tenant, task.attempt))
        return user.upper()

    notify.enqueue("ann", tenant="acme")
    asyncio.run(notify.aenqueue("bob", tenant="acme"))
    results = queue.run_all()  # from sync code
    assert [r.result for r in results] == ["ANN", "BOB"]

    async def from_a_coroutine() -> list[Any]:
        await notify.aenqueue("cy", tenant="acme")
        notify.enqueue("di", tenant="acme")
        ran = [r.result for r in await queue.arun_all()]
        notify.enqueue("ed", tenant="acme")
        return ran + [r.result for r in queue.run_all()]  # run_all from a coroutine too

    assert asyncio.run(from_a_coroutine()) == ["CY", "DI", "ED"]
    assert seen == [("acme", 1)] * 5
    with pytest.raises(LookupError):
        current_task.get()  # not left set in the caller's context


def test_timeouts_fail_the_task(queue: InMemory, app: rota.App) -> None:
    @app.task(timeout=0.05, max_attempts=1)
    def slow() -> None:
        time.sleep(0.5)

    @app.task(timeout=0.05, max_attempts=1)
    async def aslow() -> None:
        await asyncio.sleep(5)

    slow.enqueue(tenant="t")
    aslow.enqueue(tenant="t")
    results = queue.run_all()
    assert [r.outcome for r in results] == ["dead", "dead"]
    assert all(re.search(r"TaskTimeout: timed out after 0.05 s", r.error or "") for r in results)


def test_system_exit_fails_like_any_error(queue: InMemory, app: rota.App) -> None:
    @app.task(max_attempts=1)
    def quits() -> None:
        raise SystemExit(3)

    @app.task(max_attempts=1)
    async def aquits() -> None:
        raise KeyboardInterrupt

    quits.enqueue(tenant="t")
    aquits.enqueue(tenant="t")
    assert [r.error for r in queue.run_all()] == [
        "SystemExit: 3",
        "rota.consumer.running.TaskAborted: the task raised KeyboardInterrupt",
    ]


def test_tasks_enqueued_by_tasks_land_in_memory(queue: InMemory, app: rota.App) -> None:
    @app.task
    def welcome(user: str) -> None: ...

    @app.task
    def signup(user: str) -> None:
        welcome.enqueue(user, tenant=current_task.get().tenant, countdown=60)

    @app.task
    async def asignup(user: str) -> None:
        await welcome.aenqueue(user, tenant="acme")

    signup.enqueue("ann", tenant="acme")
    asignup.enqueue("bob", tenant="acme")
    assert queue.run_all().succeeded == 3  # bob's welcome ran; ann's waits a minute
    assert [(t.args, t.status) for t in queue.tasks(task="welcome")] == [
        (["ann"], "scheduled"),
        (["bob"], "succeeded"),
    ]
    assert queue.run_all(advance=True).succeeded == 1


def test_tenants_are_served_in_fair_order(queue: InMemory, app: rota.App) -> None:
    @app.task
    def job(n: int) -> None: ...

    app.enqueue_many([job.call(n, tenant="flood") for n in range(5)])
    job.enqueue(0, tenant="steady")
    job.enqueue(1, tenant="steady")
    job.enqueue(0, tenant="quiet")
    order = [r.task.tenant for r in queue.run_all()]
    assert order == ["flood", "steady", "quiet", "flood", "steady", "flood", "flood", "flood"]


def test_weights_and_costs_give_shares(app: rota.App) -> None:
    @app.task
    def job(n: int) -> None: ...

    with InMemory(app, weights={"gold": 2}) as queue:
        app.enqueue_many([job.call(n, tenant=t) for n in range(4) for t in ("gold", "tin")])
        job.enqueue(0, tenant="big", cost=3)
        job.enqueue(1, tenant="big", cost=3)
        order = "".join(r.task.tenant[0] for r in queue.run_all())
    assert order == "gtbggtgttb"


def test_late_tenants_are_served_within_a_round(queue: InMemory, app: rota.App) -> None:
    @app.task
    def job(n: int) -> None:
        if n == 2:
            job.enqueue(99, tenant="late")

    app.enqueue_many([job.call(n, tenant="flood") for n in range(6)])
    order = [(r.task.tenant, r.task.args[0]) for r in queue.run_all()]
    assert order.index(("late", 99)) == 4  # within a round, not after the flood


def test_unknown_task_names_wait(queue: InMemory, app: rota.App) -> None:
    app.enqueue("billing.invoice", args=[1], queue="billing", tenant="t")
    assert queue.run_all().runs == []
    (waiting,) = queue.waiting()
    assert (waiting.name, waiting.queue, waiting.status) == (
        "billing.invoice",
        "billing",
        "pending",
    )


def test_capacities_push_back(app: rota.App) -> None:
    @app.task
    def job() -> None: ...

    with InMemory(app, capacities={"small": 2}) as queue:
        job.enqueue(tenant="small")
        job.enqueue(tenant="small")
        with pytest.raises(CapacityExceeded):
            job.enqueue(tenant="small")
        job.enqueue(tenant="other")
        assert len(queue.waiting()) == 3


def test_a_start_time_and_a_run_limit(app: rota.App) -> None:
    @app.task
    def forever() -> None:
        forever.enqueue(tenant="t")

    start = datetime(2031, 5, 6, 7, 8, tzinfo=UTC)
    with InMemory(app, now=start) as queue:
        assert start <= queue.now() < start + timedelta(seconds=5)
        forever.enqueue(tenant="t")
        assert len(queue.run_all(limit=25)) == 25
        (waiting,) = queue.waiting()
        assert waiting.enqueued_at >= start
        assert queue.get(waiting.id) is waiting
        assert queue.dead_letters == []


def test_the_retry_rules_are_rota_fails() -> None:
    """rota.testing.line decides a failed attempt as rota.fail does and backs
    off as rota.backoff_seconds: if one of these changes, change the other."""
    fail = SCHEMA[SCHEMA.index("CREATE FUNCTION rota.fail(") :]
    assert (
        "CASE WHEN f.final OR t.cancel_requested OR f.attempt >= t.max_attempts THEN NULL\n"
        "                    ELSE coalesce(f.retry_at, now() + make_interval(secs =>\n"
        "                        rota.backoff_seconds(f.attempt, t.backoff_base, t.backoff_max)))"
    ) in fail
    backoff = SCHEMA[SCHEMA.index("CREATE FUNCTION rota.backoff_seconds(") :]
    assert (
        "SELECT d / 2 + random() * d / 2\n"
        "    FROM (SELECT least(p_max, p_base * power(2, least(p_attempt - 1, 60))) AS d) x"
    ) in backoff
    assert backoff_seconds(1, 10, 3600, lambda: 0.0) == 5
    assert backoff_seconds(3, 10, 3600, lambda: 1.0) == 40
    assert backoff_seconds(40, 1, 60, lambda: 1.0) == 60
    assert backoff_seconds(10_000, 1, 1e30, lambda: 1.0) == 2.0**60  # the exponent stops at 60


def test_priority_runs_a_tenants_urgent_task_at_its_next_turn(
    queue: InMemory, app: rota.App
) -> None:
    @app.task
    def job(n: int) -> None: ...

    app.enqueue_many([job.call(n, tenant="flood") for n in range(5)])
    job.enqueue(0, tenant="steady")
    job.enqueue(1, tenant="steady")
    job.enqueue(99, tenant="flood", priority=9)  # behind flood's own backlog
    job.enqueue(98, tenant="flood", priority=5)
    order = [(r.task.tenant, r.task.args[0]) for r in queue.run_all()]
    # The tenants' turns are as without priorities; flood's turns run its
    # most urgent tasks first, each displaced task taking the urgent one's
    # place (as rota.claim swaps them).
    assert [t for t, _ in order] == ["flood", "steady", "flood", "steady"] + ["flood"] * 5
    assert [n for t, n in order if t == "flood"] == [99, 98, 2, 3, 4, 0, 1]


def test_everything_urgent_is_no_more_than_a_share(queue: InMemory, app: rota.App) -> None:
    @app.task
    def job(n: int) -> None: ...

    app.enqueue_many([job.call(n, tenant="loud", priority=9) for n in range(4)])
    app.enqueue_many([job.call(n, tenant="calm") for n in range(4)])
    order = "".join(r.task.tenant[0] for r in queue.run_all())
    assert order == "lclclclc"
