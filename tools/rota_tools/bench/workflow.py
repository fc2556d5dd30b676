"""`rota bench workflow`: many tenants' small workflows (a group with a
join) beside one tenant's huge group. Every join must run exactly once; the
small tenants' joins should finish about as soon as without the huge group
(each task of a graph takes its tenant's turns); and a workflow member
should cost about what a plain task does."""

from __future__ import annotations

import contextlib
import statistics
import time
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import psycopg

import rota
from rota import App, Settings
from rota.core import db
from rota.model.envelope import make_envelope
from rota_tools.bench.harness import (
    QUEUE,
    finished,
    load,
    reset,
    wait_for,
    wait_for_finished,
    workers,
)
from rota_tools.sql import query
from rota_tools.stats import in_turns

WORKERS, CONCURRENCY = 2, 8


def _app(settings: Settings) -> App:
    from rota_tools.bench import noop

    app = App(settings)
    app.tasks.update(noop.app.tasks)
    return app


def _flow(app: App, tenant: str, members: int) -> UUID:
    """Enqueues a group of `members` no-op tasks of `tenant` with a join; its join."""
    noop, gathered = app.tasks["noop"], app.tasks["gathered"]
    group = rota.group(*(noop.using(tenant=tenant).prepare(i) for i in range(members)))
    return app.enqueue_workflow(group.then(gathered.using(tenant=tenant).receiving())).last


def _flows(app: App, tenants: int, members: int, big: int) -> tuple[list[UUID], int]:
    """Enqueues the graphs; returns the small tenants' joins and the tasks in all."""
    if big:
        _flow(app, "huge", big)
    joins = [_flow(app, f"t{t}", members) for t in range(tenants)]
    return joins, big + (1 if big else 0) + tenants * (members + 1)


def _run(
    conn: psycopg.Connection[Any], settings: Settings, tenants: int, members: int, big: int
) -> dict[str, Any]:
    reset(conn)
    with contextlib.closing(_app(settings)) as app:
        joins, total = _flows(app, tenants, members, big)
    since = datetime.now(UTC)

    def joins_done() -> tuple[int, int, list[Any]]:
        row = conn.execute(query("bench_joins_done"), {"ids": joins, "since": since}).fetchone()
        return (int(row[0]), int(row[1]), row[2]) if row else (0, 0, [])

    with workers(settings, WORKERS, concurrency=CONCURRENCY, batch_size=100) as running:
        # Every join run, or half an hour: the report counts those that ran.
        wait_for(lambda: joins_done()[0] == len(joins), 1800, poll=0.1, processes=running)
        wait_for_finished(conn, total, running)
    done_, twice, seconds = joins_done()
    return {
        "joins": len(joins),
        "joins_run": int(done_),
        "joins_run_twice": int(twice),
        "join_seconds_p50": statistics.median(float(s) for s in seconds) if seconds else None,
    }


def _rate(conn: psycopg.Connection[Any], settings: Settings, tasks: int, workflow: bool) -> float:
    """Tasks/s of one worker process: plain no-op tasks, or as many members
    of 100-member groups with joins (the joins not counted)."""
    reset(conn)
    if workflow:
        with contextlib.closing(_app(settings)) as app:
            for g in range(tasks // 100):
                _flow(app, f"t{g % 100}", 100)
    else:
        load(
            conn,
            [
                make_envelope(name="noop", queue=QUEUE, tenant=f"t{i % 100}", args=[i])
                for i in range(tasks)
            ],
        )
    with workers(settings, 1, concurrency=CONCURRENCY, batch_size=100) as running:
        wait_for_finished(conn, 200, running)
        begin, started = finished(conn), time.perf_counter()
        wait_for_finished(conn, tasks, running)  # the members (joins come after)
        return (finished(conn) - begin) / (time.perf_counter() - started)


def bench_workflow(
    settings: Settings, tenants: int, members: int, big: int, step_tasks: int, runs: int
) -> dict[str, Any]:
    with db.connect(settings.database_url) as conn:
        alone: list[dict[str, Any]] = []
        beside: list[dict[str, Any]] = []
        plain: list[float] = []
        steps: list[float] = []
        for run in range(runs):
            for with_big in in_turns((False, True), run):
                ran = _run(conn, settings, tenants, members, big if with_big else 0)
                (beside if with_big else alone).append(ran)
            for workflow in in_turns((False, True), run):
                rate = _rate(conn, settings, step_tasks, workflow=workflow)
                (steps if workflow else plain).append(rate)
    p50_alone = statistics.median(r["join_seconds_p50"] for r in alone)
    p50_beside = statistics.median(r["join_seconds_p50"] for r in beside)
    plain_rate, step_rate = statistics.median(plain), statistics.median(steps)
    return {
        "params": {
            "tenants": tenants,
            "members": members,
            "big_group": big,
            "workers": WORKERS,
            "concurrency": CONCURRENCY,
            "step_tasks": step_tasks,
            "runs": runs,
        },
        "joins": sum(r["joins"] for r in beside),
        "joins_run": sum(r["joins_run"] for r in beside),
        "joins_run_twice": sum(r["joins_run_twice"] for r in beside + alone),
        "small_tenants_join_p50_s": {
            "alone": round(p50_alone, 3),
            "beside_big": round(p50_beside, 3),
        },
        "small_tenants_join_p50_ratio_to_alone": round(p50_beside / p50_alone, 3),
        "tasks_per_s": {"plain": round(plain_rate), "workflow_members": round(step_rate)},
        "step_cost_ratio_to_plain": round(plain_rate / step_rate, 3),
        "runs_detail": {
            "alone": alone,
            "beside_big": beside,
            "tasks_per_s": {
                "plain": [round(r) for r in plain],
                "workflow_members": [round(r) for r in steps],
            },
        },
        "goal": {
            "joins_run_twice": 0,
            "small_tenants_join_p50_ratio_to_alone_at_most": 1.2,
            "step_cost_ratio_to_plain_at_most": 1.3,
        },
    }
