"""The app of the progress tests: tasks that report progress in a tight loop
and wait, half-way, for the test's go (a file) before they finish."""

from __future__ import annotations

import asyncio
import os
import time

import rota

app = rota.App.from_env()

CALLS = 1_000_000


def _wait_sync(go: str) -> None:
    while not os.path.exists(go):
        time.sleep(0.02)


def _count(ctx: rota.TaskContext, start: int, stop: int) -> None:
    for i in range(start, stop):
        ctx.progress(i + 1, CALLS, f"item {i + 1}")


@app.task(queue="progress", result_ttl=600)
def count(go: str) -> float:
    """Reports CALLS times, waits for `go` half-way; returns its seconds."""
    started = time.monotonic()
    ctx = rota.context()
    _count(ctx, 0, CALLS // 2)
    _wait_sync(go)
    _count(ctx, CALLS // 2, CALLS)
    ctx.progress(CALLS, CALLS, "done")
    return time.monotonic() - started


@app.task(queue="progress", result_ttl=600)
async def count_async(go: str) -> float:
    started = time.monotonic()
    ctx = rota.context()
    _count(ctx, 0, CALLS // 2)
    while not os.path.exists(go):
        await asyncio.sleep(0.02)
    _count(ctx, CALLS // 2, CALLS)
    ctx.progress(CALLS, CALLS, "done")
    return time.monotonic() - started


@app.task(queue="progress", result_ttl=600)
def refused(go: str) -> list[str]:
    """Reports bad values, each refused to it; then one good, and waits for `go`."""
    ctx = rota.context()
    errors = []
    bad: list[tuple[object, object, object]] = [
        (-1, None, None),
        (5, 2, None),
        (float("nan"), None, None),
        (1, float("inf"), None),
        ("3", None, None),
        (True, None, None),
        (1, 2, 42),
    ]
    for done, total, message in bad:
        try:
            ctx.progress(done, total, message)  # type: ignore[arg-type]
        except rota.ValidationError as exc:
            errors.append(str(exc))
    ctx.progress(2, 3, "x" * 2000)  # cut, not refused
    _wait_sync(go)
    return errors


@app.task(queue="progress", max_attempts=1)
def fails_after_progress() -> None:
    rota.context().progress(7, message="half-way, then it fails")
    raise RuntimeError("failed after its progress")
