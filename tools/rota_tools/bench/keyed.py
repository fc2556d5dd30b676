"""`rota bench keyed-limits`: limits on keys other than the tenant. One
worker's no-op tasks alone and beside 10,000 tasks in line on a saturated
key (its slots held by claims that do not end): the waiting tasks are parked
by the first claims that meet them and never stepped over again, so the
others should lose nothing. Then two workers run keyed tasks while the key's
running count is sampled: it must never pass the limit."""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg

from rota import Limit, Settings, core
from rota.core import db
from rota.model.envelope import make_envelope
from rota_tools.bench.harness import QUEUE, in_background, load, reset, wait_for, workers
from rota_tools.sql import query
from rota_tools.stats import in_turns

KEY = "bench-key"  # the limit the no-op app's `keyed` task counts against
CONCURRENCY = 8
PLAIN_TENANTS = [f"t{i}" for i in range(100)]
KEYED_TENANTS = [f"k{i}" for i in range(100)]


def _load(conn: psycopg.Connection[Any], tasks: int, waiting: int, seconds: float) -> None:
    """`waiting` keyed tasks first (ahead in line, across their tenants),
    then `tasks` no-op tasks."""
    keyed = [
        make_envelope(
            name="keyed",
            queue=QUEUE,
            tenant=KEYED_TENANTS[i % len(KEYED_TENANTS)],
            args=[seconds],
            limit_key=KEY,
        )
        for i in range(waiting)
    ]
    plain = [
        make_envelope(name="noop", queue=QUEUE, tenant=PLAIN_TENANTS[i % 100], args=[i])
        for i in range(tasks)
    ]
    load(conn, keyed + plain)


def _finished_of(conn: psycopg.Connection[Any], tenants: list[str]) -> int:
    row = conn.execute(query("bench_finished_of"), {"tenants": tenants}).fetchone()
    assert row is not None
    return int(row[0])


def _throughput(
    conn: psycopg.Connection[Any], settings: Settings, tasks: int, waiting: int, limit: int
) -> tuple[float, float]:
    """No-op tasks/s of one worker process, with `waiting` keyed tasks in
    line on a saturated key (0: none): once they are parked, and over the
    whole run (the claims that park them included)."""
    reset(conn)
    db.transact(conn, core.set_limit(Limit(KEY, concurrency=limit), "bench"))
    _load(conn, tasks, waiting, 0.0)
    if waiting:
        # The key's slots, held: claimed by a "worker" that never ends them.
        held = 0
        while held < limit:
            got = db.transact(conn, core.claim([QUEUE], limit - held, "holder", 3600.0))
            held += sum(t.name == "keyed" for t in got)
            db.transact(conn, core.release(t.token for t in got if t.name != "keyed"))
    with workers(settings, 1, concurrency=CONCURRENCY, batch_size=100) as running:
        _until_finished(conn, PLAIN_TENANTS, 500, running)
        first, whole = _finished_of(conn, PLAIN_TENANTS), time.perf_counter()
        # The steady state is timed once the waiting tasks are parked (the
        # claims that meet them set each aside once, early in the run).
        while _parked(conn) < waiting - limit:
            _until_finished(conn, PLAIN_TENANTS, _finished_of(conn, PLAIN_TENANTS) + 1, running)
        begin, started = _finished_of(conn, PLAIN_TENANTS), time.perf_counter()
        _until_finished(conn, PLAIN_TENANTS, tasks, running)
        done, ended = _finished_of(conn, PLAIN_TENANTS), time.perf_counter()
        return (done - begin) / (ended - started), (done - first) / (ended - whole)


def _parked(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(query("bench_parked_count")).fetchone()
    assert row is not None
    return int(row[0])


def _until_finished(
    conn: psycopg.Connection[Any], tenants: list[str], count: int, workers: Any
) -> None:
    """Until `count` tasks of `tenants` finished."""
    condition = lambda: _finished_of(conn, tenants) >= count  # noqa: E731
    wait_for(condition, 3600, what=f"{count} tasks to finish", poll=0.01, processes=workers)


def _held_limit(
    conn: psycopg.Connection[Any], settings: Settings, keyed: int, limit: int
) -> dict[str, int]:
    """Two workers run `keyed` 5 ms tasks of the key beside as many no-op
    ones; the key's running count, sampled throughout: its peak and samples."""
    reset(conn)
    db.transact(conn, core.set_limit(Limit(KEY, concurrency=limit), "bench"))
    _load(conn, keyed, keyed, 0.005)
    running: list[int] = []

    def sample(watcher: psycopg.Connection[Any]) -> None:
        row = watcher.execute(query("bench_key_running"), {"key": KEY}).fetchone()
        running.append(int(row[0]) if row else 0)

    watch = lambda: psycopg.connect(settings.database_url, autocommit=True)  # noqa: E731
    two = workers(settings, 2, concurrency=CONCURRENCY, batch_size=20)
    with two as started, in_background(watch, sample):
        _until_finished(conn, KEYED_TENANTS, keyed, started)
    return {"peak_running": max(running, default=0), "samples": len(running)}


def bench_keyed_limits(
    settings: Settings, tasks: int, waiting: int, limit: int, keyed: int, runs: int
) -> dict[str, Any]:
    with db.connect(settings.database_url) as conn:
        alone: list[tuple[float, float]] = []
        beside: list[tuple[float, float]] = []
        held = []
        for run in range(runs):
            held.append(_held_limit(conn, settings, keyed, limit))
            for with_waiting in in_turns((False, True), run):
                rates = _throughput(conn, settings, tasks, waiting if with_waiting else 0, limit)
                (beside if with_waiting else alone).append(rates)
    steady_alone, whole_alone = [a for a, _ in alone], [w for _, w in alone]
    steady, whole = [b for b, _ in beside], [w for _, w in beside]
    peak = max(h["peak_running"] for h in held)
    return {
        "params": {
            "tasks": tasks,
            "waiting_on_the_key": waiting,
            "key_limit": limit,
            "keyed_tasks_run": keyed,
            "worker_concurrency": CONCURRENCY,
            "runs": runs,
        },
        "unlimited_tasks_per_s": {
            "alone": round(statistics.median(steady_alone)),
            "beside_waiting": round(statistics.median(steady)),
            "runs_alone": [round(r) for r in steady_alone],
            "runs_beside_waiting": [round(r) for r in steady],
        },
        "unlimited_ratio_to_alone": round(
            statistics.median(steady) / statistics.median(steady_alone), 3
        ),
        # The whole run, the claims that park the waiting tasks included.
        "unlimited_ratio_to_alone_whole_run": round(
            statistics.median(whole) / statistics.median(whole_alone), 3
        ),
        "key_peak_running": peak,
        "key_samples": sum(h["samples"] for h in held),
        "max_running_over_limit": max(0, peak - limit),
        "goal": {"unlimited_ratio_to_alone_at_least": 0.9, "max_running_over_limit": 0},
    }
