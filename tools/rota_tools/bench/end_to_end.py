"""`rota bench end-to-end`: the whole pipeline as deployed, each part its own
process: a producer at a steady rate (this process) -> Redis -> a Python
loader -> 2 worker processes; beside it the floors its starts are read
against (rota_tools.bench.starts) and the round trips on a start's way
(rota_tools.bench.roundtrips). `--tracing` runs each mode in a fresh process
tree: a tracer provider is set once per process.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rota import Settings
from rota.buffer import redis_client
from rota.core import db
from rota_tools.bench.cpu import (
    CpuMeter,
    Probe,
    pid_probe,
    postgres_probe,
    process_tree_seconds,
    redis_probe,
)
from rota_tools.bench.harness import (
    bench_app,
    empty,
    finished,
    offer,
    p50_p99,
    ratio,
    skewed_tenant,
    stopping,
    wait_for,
    wait_for_finished,
    workers,
)
from rota_tools.processes import spawn_loader
from rota_tools.sql import query

WORKERS = 2
SITE = Path(__file__).parent / "tracing_site"
# Off; every span kept; one trace in ten kept.
TRACING_MODES = ("off", "on", "sampled")


def pipeline_run(
    settings: Settings,
    tasks: int,
    tenants: int,
    rate: float,
    concurrency: int,
    fleet: Settings | None = None,
    probes: dict[str, Probe] | None = None,
) -> dict[str, Any]:
    """One run of the pipeline (the module's docstring). The loader and
    workers run with `fleet` (a pooler's URL, say) when given; `probes` add
    processes to the CPU report."""
    fleet = fleet or settings
    app = bench_app(settings)
    noop = app.tasks["noop"]
    client = redis_client.connect(settings)
    with db.connect(settings.database_url) as conn:
        empty(conn, settings)
        started_workers = workers(fleet, WORKERS, concurrency=concurrency, batch_size=100)
        with stopping([spawn_loader(fleet)]) as (loader,), started_workers as running:
            processes = [loader, *running]
            # One task through the whole pipeline: every process is up. It is
            # then forgotten, as the first task of a cold pipeline says nothing
            # of the steady state.
            live = lambda: conn.execute(query("bench_live_workers")).fetchone() == (WORKERS,)  # noqa: E731
            wait_for(live, 60, what="the workers to register", processes=processes)
            first = noop.using(tenant="bench-warm-up").enqueue(-1, "warm-up")
            wait_for(
                lambda: finished(conn) == 1, 60, what="a first task to run", processes=processes
            )
            conn.execute(query("bench_forget_finished"), {"id": first})
            meter = CpuMeter(
                {
                    "producer": pid_probe(os.getpid()),
                    "loader": pid_probe(loader.pid),
                    **{f"worker_{n}": pid_probe(w.pid) for n, w in enumerate(running, 1)},
                    "postgresql": postgres_probe(conn),
                    "redis": redis_probe(client),
                    **(probes or {}),
                }
            )
            meter.start()

            def send(first: int, n: int) -> None:
                at = range(first, first + n)
                app.enqueue_many(
                    [noop.using(tenant=skewed_tenant(i, tenants)).prepare(i, "pad") for i in at]
                )

            started = offer(tasks, rate, send)
            wait_for_finished(conn, tasks, processes, drained=True)
            elapsed = time.perf_counter() - started
            cpu = meter.report(elapsed, tasks)
        starts = [float(r[0]) for r in conn.execute(query("bench_start_latencies"))]
    app.close()
    client.close()
    return {
        "params": {
            "tasks": tasks,
            "tenants": tenants,
            "offered_rate": rate,
            "concurrency": concurrency,
            "workers": WORKERS,
            "loader": "python",
            "database_pooling": fleet.database_pooling,
            "listen": fleet.session_database_url is not None,
        },
        "tasks_per_s": round(tasks / elapsed),
        "enqueue_to_start_ms": p50_p99(starts),
        "cpu": cpu,
    }


def bench_end_to_end(
    settings: Settings,
    tasks: int,
    tenants: int,
    rate: float,
    concurrency: int,
    pgbouncer: bool = False,
) -> dict[str, Any]:
    """The pipeline's run, its round trips, and the floors beside it: what
    rota's hops (buffer -> loader -> commit -> NOTIFY -> claim) add to a
    Redis pop and to a durable queue written straight into PostgreSQL, at
    the same pace; and that queue flooded as rota was (every task, the same
    rate, two consumers), which rota's throughput and CPU are read against."""
    from rota_tools.bench.roundtrips import start_round_trips
    from rota_tools.bench.starts import postgres_queue_baseline, start_baselines

    figures = pipeline_run(settings, tasks, tenants, rate, concurrency)
    figures["round_trips"] = start_round_trips(settings)
    figures |= start_baselines(settings, min(tasks, 5000), rate)
    flood = postgres_queue_baseline(settings, tasks, rate, consumers=2)
    figures["postgres_queue_flood"] = flood
    # The floors of what every rota task has beyond the plain queue: its
    # record kept at completion; its function run by a pool of threads.
    for floor in ("kept", "threads"):
        floored = postgres_queue_baseline(settings, tasks, rate, consumers=2, floor=floor)
        figures[f"postgres_queue_flood_{floor}"] = floored
    figures["tasks_per_s_to_postgres_queue_flood"] = ratio(
        figures["tasks_per_s"], flood["tasks_per_s"]
    )
    us = (figures["cpu"]["all_us_per_task"], flood["cpu"]["all_us_per_task"])
    figures["cpu_per_task_to_postgres_queue_flood"] = ratio(*us)
    p50 = figures["enqueue_to_start_ms"]["p50"]
    for key in ("redis_pop", "postgres_queue"):
        floor = figures[f"{key}_baseline"]["enqueue_to_start_ms"]["p50"]
        figures[f"p50_over_{key}_ms"] = round(p50 - floor, 1)
    if pgbouncer:

        def again(fleet: Settings, probes: dict[str, Probe]) -> dict[str, Any]:
            return pipeline_run(settings, tasks, tenants, rate, concurrency, fleet, probes)

        figures |= _behind_pgbouncer(settings, again)
    return figures


def _behind_pgbouncer(
    settings: Settings, measure: Callable[[Settings, dict[str, Probe]], dict[str, Any]]
) -> dict[str, Any]:
    """`measure` again with the fleet behind PgBouncer in transaction mode
    (PostgreSQL must be on this machine): LISTEN on the direct URL, then
    polling every ROTA_POLL_SECONDS."""
    from psycopg.conninfo import make_conninfo

    from rota_tools.devservers import start_pgbouncer

    bouncer = start_pgbouncer(settings.database_url, pool_mode="transaction")
    try:
        assert bouncer.process is not None
        pid = bouncer.process.pid
        probes: dict[str, Probe] = {"pgbouncer": lambda: process_tree_seconds(pid)}
        # The same database, through the pooler.
        url = make_conninfo(settings.database_url, host="127.0.0.1", port=str(bouncer.port))
        pooled = settings.model_copy(
            update={"database_url": url, "database_pooling": "transaction"}
        )
        listen = pooled.model_copy(update={"direct_database_url": settings.database_url})
        return {
            "pgbouncer_listen": measure(listen, probes),
            "pgbouncer_poll": measure(pooled, probes),
        }
    finally:
        bouncer.stop()


def _traced_run(settings: Settings, mode: str, *args: Any) -> dict[str, Any]:
    saved = dict(os.environ)
    if mode != "off":
        os.environ["ROTA_BENCH_TRACING"] = mode
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(SITE), os.environ.get("PYTHONPATH")])
        )
    try:
        spawn = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
            figures: dict[str, Any] = pool.submit(pipeline_run, settings, *args).result()
            return figures
    finally:
        os.environ.clear()
        os.environ.update(saved)


def bench_tracing(
    settings: Settings, tasks: int, tenants: int, rate: float, concurrency: int, rounds: int
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in TRACING_MODES}
    for _ in range(rounds):
        for mode in TRACING_MODES:
            runs[mode].append(_traced_run(settings, mode, tasks, tenants, rate, concurrency))

    def median(mode: str, pick: Callable[[dict[str, Any]], float]) -> float:
        return float(statistics.median(pick(run) for run in runs[mode]))

    def cpu_per_task(run: dict[str, Any]) -> float:
        return float(run["cpu"]["all_us_per_task"])

    rate_ = {m: median(m, lambda r: r["tasks_per_s"]) for m in TRACING_MODES}
    cpu = {m: median(m, cpu_per_task) for m in TRACING_MODES}
    p50 = {m: median(m, lambda r: r["enqueue_to_start_ms"]["p50"]) for m in TRACING_MODES}
    return {
        "params": {**runs["off"][0]["params"], "rounds": rounds},
        "tasks_per_s": {m: round(rate_[m]) for m in TRACING_MODES},
        "on_to_off": round(rate_["on"] / rate_["off"], 3),
        "sampled_to_off": round(rate_["sampled"] / rate_["off"], 3),
        "cpu_us_per_task": {m: round(cpu[m], 1) for m in TRACING_MODES},
        "enqueue_to_start_p50_ms": {m: round(p50[m], 2) for m in TRACING_MODES},
        "runs": {
            m: [
                {
                    "tasks_per_s": r["tasks_per_s"],
                    "cpu_us_per_task": cpu_per_task(r),
                    "us_per_task_by_process": {
                        name: used.get("us_per_task")
                        for name, used in r["cpu"]["per_process"].items()
                    },
                }
                for r in runs[m]
            ]
            for m in TRACING_MODES
        },
        "goal": {"on_to_off_at_least": 0.9},
    }
