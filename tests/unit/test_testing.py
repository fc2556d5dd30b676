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

REPORTS = (Path(rota.__file__).parent / "sql" / "functions" / "reports.sql").read_text()


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
        task_id = send_mail.using(tenant="acme").enqueue("a@example.com", subject="welcome")
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
        await child.using(tenant="t").aenqueue(n)

    with InMemory(app) as queue:
        parent.using(tenant="t").enqueue(1)
        app.enqueue_many([parent.using(tenant="t").prepare(n) for n in range(2, 600)])
        asyncio.run(parent.using(tenant="t").aenqueue(600))
        child.using(tenant="t", connection=object()).enqueue(0)  # stored as if committed
        assert queue.run_all().succeeded == 1201
        with pytest.raises(RuntimeError, match="no Redis"):
            queue.producer.redis  # noqa: B018
    app.close()


def test_connection_enqueues_are_stored(queue: InMemory, app: rota.App) -> None:
    @app.task
    def job() -> None: ...

    task_id = job.using(tenant="t", connection=object()).enqueue()
    assert [t.id for t in queue.waiting()] == [task_id]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda task: task.using(tenant="bad tenant").prepare("x"), InvalidName),
        (lambda task: task.using(tenant="t").prepare(math.nan), NotJSONSerializable),
        (lambda task: task.using(tenant="t").prepare({1, 2}), NotJSONSerializable),
        (lambda task: task.using(tenant="t").prepare("x" * 300_000), PayloadTooLarge),
        (lambda task: task.using(tenant="t").prepare("x", "y", "z"), ValidationError),  # signature
        (lambda task: task.using(tenant="t", countdown="5").prepare("x"), ValidationError),
        (
            lambda task: task.using(tenant="t", countdown=1, eta=datetime.now(UTC)).prepare("x"),
            ValidationError,
        ),
        (
            lambda task: task.using(tenant="t", eta=datetime(2030, 1, 1)).prepare("x"),
            ValidationError,
        ),
        (lambda task: task.using(tenant="t", cost=0).prepare("x"), ValidationError),
        (lambda task: task.using(tenant="t", idempotency_key="").prepare("x"), ValidationError),
        (lambda task: task.using(tenant="t").prepare(2**64), ValidationError),
        (lambda task: rota.TaskCall("nope", "t"), UnknownTask),
        (lambda task: rota.TaskCall("job", "t", ["x"], {"tenant": "x"}), ValidationError),
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
            asyncio.run(app.aenqueue_many([job.using(tenant="t").prepare("ok"), call(job)]))
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

    first = charge.using(tenant="acme", idempotency_key="order-1").enqueue(5)
    again = charge.using(tenant="acme", idempotency_key="order-1").enqueue(7)
    other = charge.using(tenant="bob", idempotency_key="order-1").enqueue(5)  # per tenant
    assert first == again != other
    ids = app.enqueue_many([charge.using(tenant="c", idempotency_key="k").prepare(1)] * 3)
    assert len(set(ids)) == 1
    assert [t.args for t in queue.waiting(tenant="acme")] == [[5]]  # the first one's
    assert queue.run_all().succeeded == 3
    assert charge.using(tenant="acme", idempotency_key="order-1").enqueue(5) == first
    assert queue.waiting() == []  # a task that ran is not brought back


def test_eta_and_countdown_are_not_run_early(queue: InMemory, app: rota.App) -> None:
    @app.task
    def later(n: int) -> int:
        return n

    start = queue.now()
    later.using(tenant="t", countdown=60).enqueue(1)
    later.using(tenant="t", eta=start + timedelta(hours=2)).enqueue(2)
    later.using(tenant="t").enqueue(3)
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

    later.using(tenant="t", countdown=10).enqueue(4)  # from the clock as it is now
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
        calls.append(rota.context().attempt)
        if len(calls) == 1:
            raise ConnectionError("smtp down")
        return "ok"

    flaky.using(tenant="t").enqueue()
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

    broken.using(tenant="t").enqueue(7)
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
        if rota.context().attempt == 1:
            raise rota.Retry(countdown=30, reason="not ready")

    poll.using(tenant="t").enqueue()
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

    stubborn.using(tenant="t").enqueue()
    results = queue.run_all()  # backoff 0: the second attempt runs at once
    assert [r.outcome for r in results] == ["retried", "dead"]
    assert "retried after the task's backoff instead" in (results.runs[0].error or "")
    assert queue.dead()[0].attempts == 2


def test_secrets_are_masked_in_stored_errors(queue: InMemory, app: rota.App) -> None:
    @app.task(max_attempts=1)
    def leaky() -> None:
        raise RuntimeError("cannot reach postgresql://rota:hunter2@db/app")

    leaky.using(tenant="t").enqueue()
    queue.run_all()
    (dead,) = queue.dead()
    assert "hunter2" not in (dead.error or "") + (dead.traceback or "")


def test_async_tasks_run_with_their_context(queue: InMemory, app: rota.App) -> None:
    seen: list[tuple[str, int]] = []

    @app.task
    async def notify(user: str) -> str:
        await asyncio.sleep(0)
        task = rota.context()
        seen.append((task.tenant, task.attempt))
        return user.upper()

    notify.using(tenant="acme").enqueue("ann")
    asyncio.run(notify.using(tenant="acme").aenqueue("bob"))
    results = queue.run_all()  # from sync code
    assert [r.result for r in results] == ["ANN", "BOB"]

    async def from_a_coroutine() -> list[Any]:
        await notify.using(tenant="acme").aenqueue("cy")
        notify.using(tenant="acme").enqueue("di")
        ran = [r.result for r in await queue.arun_all()]
        notify.using(tenant="acme").enqueue("ed")
        return ran + [r.result for r in queue.run_all()]  # run_all from a coroutine too

    assert asyncio.run(from_a_coroutine()) == ["CY", "DI", "ED"]
    assert seen == [("acme", 1)] * 5
    with pytest.raises(rota.OutsideTask):
        rota.context()  # not left set in the caller's context


def test_timeouts_fail_the_task(queue: InMemory, app: rota.App) -> None:
    @app.task(timeout=0.05, max_attempts=1)
    def slow() -> None:
        time.sleep(0.5)

    @app.task(timeout=0.05, max_attempts=1)
    async def aslow() -> None:
        await asyncio.sleep(5)

    slow.using(tenant="t").enqueue()
    aslow.using(tenant="t").enqueue()
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

    quits.using(tenant="t").enqueue()
    aquits.using(tenant="t").enqueue()
    assert [r.error for r in queue.run_all()] == [
        "SystemExit: 3",
        "rota.consumer.running.TaskAborted: the task raised KeyboardInterrupt",
    ]


def test_tasks_enqueued_by_tasks_land_in_memory(queue: InMemory, app: rota.App) -> None:
    @app.task
    def welcome(user: str) -> None: ...

    @app.task
    def signup(user: str) -> None:
        welcome.using(tenant=rota.context().tenant, countdown=60).enqueue(user)

    @app.task
    async def asignup(user: str) -> None:
        await welcome.using(tenant="acme").aenqueue(user)

    signup.using(tenant="acme").enqueue("ann")
    asignup.using(tenant="acme").enqueue("bob")
    assert queue.run_all().succeeded == 3  # bob's welcome ran; ann's waits a minute
    assert [(t.args, t.status) for t in queue.tasks(task="welcome")] == [
        (["ann"], "scheduled"),
        (["bob"], "succeeded"),
    ]
    assert queue.run_all(advance=True).succeeded == 1


def test_tenants_are_served_in_fair_order(queue: InMemory, app: rota.App) -> None:
    @app.task
    def job(n: int) -> None: ...

    app.enqueue_many([job.using(tenant="flood").prepare(n) for n in range(5)])
    job.using(tenant="steady").enqueue(0)
    job.using(tenant="steady").enqueue(1)
    job.using(tenant="quiet").enqueue(0)
    order = [r.task.tenant for r in queue.run_all()]
    assert order == ["flood", "steady", "quiet", "flood", "steady", "flood", "flood", "flood"]


def test_weights_and_costs_give_shares(app: rota.App) -> None:
    @app.task
    def job(n: int) -> None: ...

    with InMemory(app, weights={"gold": 2}) as queue:
        app.enqueue_many(
            [job.using(tenant=t).prepare(n) for n in range(4) for t in ("gold", "tin")]
        )
        job.using(tenant="big", cost=3).enqueue(0)
        job.using(tenant="big", cost=3).enqueue(1)
        order = "".join(r.task.tenant[0] for r in queue.run_all())
    assert order == "gtbggtgttb"


def test_late_tenants_are_served_within_a_round(queue: InMemory, app: rota.App) -> None:
    @app.task
    def job(n: int) -> None:
        if n == 2:
            job.using(tenant="late").enqueue(99)

    app.enqueue_many([job.using(tenant="flood").prepare(n) for n in range(6)])
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
        job.using(tenant="small").enqueue()
        job.using(tenant="small").enqueue()
        with pytest.raises(CapacityExceeded):
            job.using(tenant="small").enqueue()
        job.using(tenant="other").enqueue()
        assert len(queue.waiting()) == 3


def test_a_start_time_and_a_run_limit(app: rota.App) -> None:
    @app.task
    def forever() -> None:
        forever.using(tenant="t").enqueue()

    start = datetime(2031, 5, 6, 7, 8, tzinfo=UTC)
    with InMemory(app, now=start) as queue:
        assert start <= queue.now() < start + timedelta(seconds=5)
        forever.using(tenant="t").enqueue()
        assert len(queue.run_all(limit=25)) == 25
        (waiting,) = queue.waiting()
        assert waiting.enqueued_at >= start
        assert queue.get(waiting.id) is waiting
        assert queue.dead_letters == []


def test_the_retry_rules_are_rota_fails() -> None:
    """rota.testing.line decides a failed attempt as rota.fail does and backs
    off as rota.backoff_seconds: if one of these changes, change the other."""
    fail = REPORTS[REPORTS.index("FUNCTION rota.fail(") :]
    assert (
        "CASE WHEN f.final OR t.cancel_requested OR f.attempt >= t.max_attempts THEN NULL\n"
        "                    ELSE coalesce(f.retry_at, now() + make_interval(secs =>\n"
        "                        rota.backoff_seconds(f.attempt, t.backoff_base, t.backoff_max)))"
    ) in fail
    backoff = REPORTS[REPORTS.index("FUNCTION rota.backoff_seconds(") :]
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

    app.enqueue_many([job.using(tenant="flood").prepare(n) for n in range(5)])
    job.using(tenant="steady").enqueue(0)
    job.using(tenant="steady").enqueue(1)
    job.using(tenant="flood", priority=9).enqueue(99)  # behind flood's own backlog
    job.using(tenant="flood", priority=5).enqueue(98)
    order = [(r.task.tenant, r.task.args[0]) for r in queue.run_all()]
    # The tenants' turns are as without priorities; flood's turns run its
    # most urgent tasks first, each displaced task taking the urgent one's
    # place (as rota.claim swaps them).
    assert [t for t, _ in order] == ["flood", "steady", "flood", "steady"] + ["flood"] * 5
    assert [n for t, n in order if t == "flood"] == [99, 98, 2, 3, 4, 0, 1]


def test_everything_urgent_is_no_more_than_a_share(queue: InMemory, app: rota.App) -> None:
    @app.task
    def job(n: int) -> None: ...

    app.enqueue_many([job.using(tenant="loud", priority=9).prepare(n) for n in range(4)])
    app.enqueue_many([job.using(tenant="calm").prepare(n) for n in range(4)])
    order = "".join(r.task.tenant[0] for r in queue.run_all())
    assert order == "lclclclc"
