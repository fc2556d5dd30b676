"""The app that acceptance tests run workers with: tasks that log when they run."""

from __future__ import annotations

import asyncio
import os
import time

import psycopg

import rota

app = rota.App.from_env()

LOG_TABLE = """CREATE TABLE IF NOT EXISTS test_log (
    task_id uuid, tenant text, attempt int, pid int,
    started double precision, ended double precision)"""


def log_run(started: float) -> None:
    task = rota.context()
    with psycopg.connect(app.settings.database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO test_log VALUES (%s, %s, %s, %s, %s, %s)",
            [task.id, task.tenant, task.attempt, os.getpid(), started, time.time()],
        )


@app.task(queue="work", max_attempts=5)
def sleep(seconds: float) -> None:
    started = time.time()
    time.sleep(seconds)
    log_run(started)


@app.task(queue="work", max_attempts=5)
async def async_sleep(seconds: float) -> None:
    started = time.time()
    await asyncio.sleep(seconds)
    log_run(started)


@app.task(queue="work", max_attempts=2)
def flaky(fail_times: int) -> None:
    if rota.context().attempt <= fail_times:
        raise rota.Retry(countdown=0.1)
    log_run(time.time())


@app.task(queue="work", max_attempts=2, backoff=0.1)
def boom() -> None:
    raise ValueError("boom")


@app.task(queue="work", timeout=0.3, max_attempts=1)
def too_slow() -> None:
    time.sleep(2)


def _run_patiently(started: float, seconds: float) -> None:
    while time.time() - started < seconds:
        rota.context().raise_if_cancelled()
        time.sleep(0.01)


@app.task(queue="work", max_attempts=5)
def patient(seconds: float) -> None:
    """Runs `seconds` unless cancelled: it looks every 10 ms (cooperative)."""
    started = time.time()
    _run_patiently(started, seconds)
    log_run(started)


@app.task(queue="work", max_attempts=5)
def patient_logged(seconds: float) -> None:
    """`patient`, logging its run as it starts (a claimed task may not have
    started yet: a test that needs it running waits for the log)."""
    started = time.time()
    log_run(started)
    _run_patiently(started, seconds)


@app.task(queue="work", result_ttl=3600)
def add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b, "attempt": rota.context().attempt}


@app.task(queue="work", result_ttl=3600)
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@app.task(queue="work", result_ttl=3600)
def huge(size: int) -> str:
    return "x" * size


@app.task(queue="work", result_ttl=3600, max_attempts=1)
def doomed() -> int:
    raise RuntimeError("doomed from the start")


@app.task(queue="work", result_ttl=0.5)
def brief() -> int:
    return 7


@app.periodic("* * * * *", tenant="cron")
def every_minute(tick: str) -> None:
    log_run(time.time())


# Poison: each kind of bad task a tenant can send; none may stop a worker.
@app.task(queue="work", max_attempts=2, backoff=0.05)
def retry_in_a_trillion_seconds() -> None:
    raise rota.Retry(countdown=1e12)


@app.task(queue="work", max_attempts=2, backoff=0.05)
def retry_soon_ish() -> None:
    raise rota.Retry(countdown="soon")  # type: ignore[arg-type]


@app.task(queue="work", max_attempts=1)
def exits() -> None:
    raise SystemExit(3)


@app.task(queue="work", max_attempts=1)
async def interrupts() -> None:
    raise KeyboardInterrupt


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


@app.task(queue="work", max_attempts=1)
def unprintable() -> None:
    raise Unprintable()


@app.task(queue="work", max_attempts=2)
def fails_once_stored() -> None:
    raise ValueError("fails")


# The process pool's limits and deaths.
@app.task(queue="work", timeout=1.0, max_attempts=1)
def hangs() -> None:
    """Stuck in C code (a sleep): only a kill stops it."""
    time.sleep(60)


@app.task(queue="work", timeout=30.0, soft_timeout=0.5, result_ttl=3600, max_attempts=1)
def tidies_up() -> str:
    try:
        time.sleep(60)
    except rota.SoftTimeLimitExceeded:
        return "tidied up"
    return "slept"


@app.task(queue="work", result_ttl=3600)
def pid() -> int:
    return os.getpid()


@app.task(queue="work", max_attempts=1)
def logs_then_sleeps(seconds: float) -> None:
    """Logs its run (with its process id) first, then sleeps."""
    log_run(time.time())
    time.sleep(seconds)


@app.task(queue="work")
def traced_step() -> None:
    """Makes a span of its own: a child of its run's span."""
    from opentelemetry import trace

    with trace.get_tracer("workapp").start_as_current_span("inside the task"):
        log_run(time.time())


# Workflows.
@app.task(queue="work", max_attempts=5)
def square(x: int) -> int:
    started = time.time()
    time.sleep(0.01)
    log_run(started)
    return x * x


@app.task(queue="work", max_attempts=5, result_ttl=3600)
def total(results: list[int], label: str) -> int:
    log_run(time.time())
    return sum(results)


@app.task(queue="work", max_attempts=5, result_ttl=3600)
def plus(previous: int, n: int) -> int:
    return previous + n
