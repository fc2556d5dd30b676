"""`rota bench work`: no-op tasks through worker processes (1 and 2, with
reports waiting for the WAL flush or not, with results kept or not), the
start of a task an idle worker is woken for, and pgqueuer's and
procrastinate's workers in databases of their own on the same server (`pip
install 'rota[bench]'`). `--pool processes`: the process pool beside the
thread pool, on CPU-bound and on no-op tasks. `--progress`: each task
reports its progress (`rota.context().progress`) once, and the figures say
how many progress writes the database saw."""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import os
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from rota import Settings, core
from rota.core import db
from rota.model.envelope import make_envelope
from rota_tools.bench.cpu import CpuMeter, pid_probe, postgres_probe
from rota_tools.bench.harness import (
    QUEUE,
    Conn,
    finished,
    fresh_database,
    load,
    p50_p99,
    reset,
    skewed_tenant,
    wait_for,
    wait_for_finished,
    warm_pool,
    workers,
)
from rota_tools.sql import query

RESULT_PAIRS = 3  # alternating runs with results kept and without
# --progress: the tasks that report their progress, in place of the no-ops.
REPORTING = {"noop": "noop_progress", "noop_result": "noop_result_progress"}


def _runs(settings: Settings, progress: bool) -> list[tuple[str, int, Settings, str]]:
    """(key, processes, settings, task) of each throughput run: the default
    (reports need no WAL flush), then reports waiting for it, as the peers'
    do (ROTA_WORKER_SYNCHRONOUS_COMMIT=true); then one process with each
    run's result kept (`result_ttl`) and without, alternating, RESULT_PAIRS
    times: their ratio is this scenario's smallest effect, and the machine's
    noise between two runs is larger."""
    synchronous = settings.model_copy(update={"worker_synchronous_commit": True})
    runs = [(str(n), n, settings, "noop") for n in (1, 2)]
    runs += [(f"{n}_synchronous_commit", n, synchronous, "noop") for n in (1, 2)]
    for _ in range(RESULT_PAIRS):
        runs += [("1_results", 1, settings, "noop_result"), ("1", 1, settings, "noop")]
    if progress:
        runs = [(key, n, s, REPORTING[name]) for key, n, s, name in runs]
    return runs


def _progress_writes(conn: Conn) -> dict[str, int]:
    """What the workers stored of their tasks' progress since the reset:
    rows written (a task's row counts once per flush that carried it), the
    tasks with a row, and the flushes (one statement each, one time apiece)."""
    writes, tasks, flushes = conn.execute(query("bench_progress_writes")).fetchone() or (0, 0, 0)
    return {"writes": int(writes), "tasks": int(tasks), "flushes": int(flushes)}


def _throughput(
    conn: Conn,
    settings: Settings,
    name: str,
    processes: int,
    tasks: int,
    tenants: int,
    concurrency: int,
) -> tuple[float, dict[str, Any]]:
    """Tasks/s of `processes` workers over a loaded queue, once they are up
    and running, and their CPU and PostgreSQL's meanwhile."""
    reset(conn)
    load(
        conn,
        (
            make_envelope(name=name, queue=QUEUE, tenant=skewed_tenant(j, tenants), args=[j])
            for j in range(tasks)
        ),
    )
    with workers(settings, processes, concurrency=concurrency, batch_size=100) as running:
        wait_for_finished(conn, 100, running)  # workers up and running
        meter = CpuMeter(
            {
                **{f"worker_{n}": pid_probe(w.pid) for n, w in enumerate(running, 1)},
                "postgresql": postgres_probe(conn),
            }
        )
        meter.start()
        begin, started = finished(conn), time.perf_counter()
        wait_for_finished(conn, tasks, running, drained=True)
        elapsed = time.perf_counter() - started
        return (tasks - begin) / elapsed, meter.report(elapsed, tasks - begin)


def _ended_progress(conn: Conn, tasks: int) -> dict[str, int]:
    """The progress writes of a run, once the last task's are stored (its
    worker stores them within about a second of its end)."""
    wait_for(lambda: _progress_writes(conn)["tasks"] >= tasks, 30, what="the last progress")
    return _progress_writes(conn)


def _start_latencies(
    conn: Conn, settings: Settings, concurrency: int
) -> tuple[list[float], list[float]]:
    """Idle workers, one task at a time, woken by NOTIFY: enqueue -> start of
    each; then result.get()'s latencies (_result_latencies)."""
    reset(conn)
    with workers(settings, 1, concurrency=concurrency, batch_size=100) as running:
        listening = lambda: conn.execute(query("bench_listening")).fetchone() == (1,)  # noqa: E731
        wait_for(listening, 60, what="the worker to LISTEN", processes=running)
        for i in range(60):
            db.transact(
                conn, core.load([make_envelope(name="noop", queue=QUEUE, tenant="t", args=[i])])
            )
            time.sleep(0.05)
        wait_for_finished(conn, 60, running)
        starts = [float(r[0]) for r in conn.execute(query("bench_start_latencies"))]
        return starts, _result_latencies(conn, settings)


def _result_latencies(conn: Conn, settings: Settings, runs: int = 40) -> list[float]:
    """Loads one task that keeps its result at a time and waits for it from
    here (an idle worker runs it); ms from its completion's transaction to
    get() returning."""
    from rota.result import Result

    latencies = []
    for i in range(runs):
        envelope = make_envelope(name="noop_result", queue=QUEUE, tenant="t", args=[i])
        db.transact(conn, core.load([envelope]))
        assert Result(settings, envelope.id).get(timeout=30) == 1
        returned = time.time()
        row = conn.execute(query("bench_finished_at"), {"id": envelope.id}).fetchone()
        assert row is not None, "a task get() returned is not in rota.finished"
        latencies.append((returned - row[0].timestamp()) * 1000)
    return latencies


def _peers(
    settings: Settings, rate: dict[str, float], tasks: int, concurrency: int
) -> dict[str, Any]:
    """pgqueuer's and procrastinate's workers on the same server, and rota's
    ratios to them (`pip install 'rota[bench]'`)."""
    url, figures = settings.database_url, dict[str, Any]()
    # Procrastinate is far slower per job: a smaller run keeps the benchmark short.
    peer_tasks = min(tasks, 5_000)
    peers: dict[str, Callable[[int], float]] = {
        "pgqueuer": lambda n: pgqueuer_throughput(url, tasks, n, 100),
        "procrastinate": lambda n: procrastinate_throughput(url, peer_tasks, n, concurrency),
    }
    for name, measure in peers.items():
        if importlib.util.find_spec(name) is None:
            figures[f"{name}_tasks_per_s"] = "not installed (pip install 'rota[bench]')"
            continue
        peer = {f"{n}_process": measure(n) for n in (1, 2)}
        figures[f"{name}_tasks_per_s"] = {k: round(v) for k, v in peer.items()}
        figures[f"ratio_to_{name}"] = {k: round(rate[k[0]] / v, 2) for k, v in peer.items()}
        if name == "pgqueuer":
            figures["synchronous_commit_ratio_to_pgqueuer"] = {
                k: round(rate[f"{k[0]}_synchronous_commit"] / v, 2) for k, v in peer.items()
            }
        else:
            figures["procrastinate_tasks"] = peer_tasks
    return figures


def bench_work(
    settings: Settings, tasks: int, tenants: int, concurrency: int, progress: bool = False
) -> dict[str, Any]:
    throughput: dict[str, list[float]] = collections.defaultdict(list)
    cpu: dict[str, Any] = {}
    writes: dict[str, list[dict[str, int]]] = collections.defaultdict(list)
    with db.connect(settings.database_url) as conn:
        for key, processes, run_settings, name in _runs(settings, progress):
            rate_, cpu[key] = _throughput(
                conn, run_settings, name, processes, tasks, tenants, concurrency
            )
            throughput[key].append(rate_)
            if progress:
                writes[key].append(_ended_progress(conn, tasks))
        starts, gets = _start_latencies(conn, settings, concurrency)
    rate = {key: statistics.median(rates) for key, rates in throughput.items()}
    return {
        "params": {
            "tasks": tasks,
            "tenants": tenants,
            "concurrency": concurrency,
            "claim_batch": 100,
        },
        "tasks_per_s": {f"{n}_process": round(rate[str(n)]) for n in (1, 2)},
        "synchronous_commit_tasks_per_s": {
            f"{n}_process": round(rate[f"{n}_synchronous_commit"]) for n in (1, 2)
        },
        "enqueue_to_start_ms": p50_p99(starts),
        "results": {
            "tasks_per_s_1_process": round(rate["1_results"]),
            # Medians of the alternating runs; None when a run too small to
            # time left nothing to divide by.
            "ratio_to_without": (round(rate["1_results"] / rate["1"], 3) if rate["1"] else None),
            "pairs": RESULT_PAIRS,
            # From the completion's transaction to get() returning, in a
            # process waiting on it meanwhile (woken by NOTIFY).
            "get_after_end_ms": p50_p99(gets),
        },
        # The two worker processes' CPU and PostgreSQL's, per task.
        "cpu": cpu["2"],
        "goal": {"start_p50_ms_at_most": 50, "ratio_to_pgqueuer_at_least": 2.0},
        # --progress: per run, the progress rows the database wrote, the
        # tasks they were of and the flushes that wrote them.
        "progress": {"reported_by_every_task": progress, "runs": dict(writes)},
        **_peers(settings, rate, tasks, concurrency),
    }


POOLS = ("threads", "processes")
# About 20 ms of pure-Python arithmetic per task on this project's machines.
CRUNCH_ROUNDS = 300_000


def _pool_rate(
    conn: Conn,
    settings: Settings,
    pool: str,
    name: str,
    args: list[Any],
    tasks: int,
    concurrency: int,
) -> float:
    """Tasks/s of one worker process with `pool`, once it is up (its first
    `concurrency` tasks, which start the children, are not timed)."""
    reset(conn)
    load(
        conn,
        [
            make_envelope(name=name, queue=QUEUE, tenant=f"t{i % 10}", args=args)
            for i in range(tasks)
        ],
    )
    batch_size = min(100, 4 * concurrency)
    with workers(settings, 1, concurrency=concurrency, batch_size=batch_size, pool=pool) as running:
        wait_for_finished(conn, min(tasks // 10, 2 * concurrency), running)
        begin, started = finished(conn), time.perf_counter()
        wait_for_finished(conn, tasks, running, drained=True)
        return (tasks - begin) / (time.perf_counter() - started)


def bench_pools(settings: Settings, cpu_tasks: int, noop_tasks: int, runs: int) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    cpu: dict[str, list[float]] = {pool: [] for pool in POOLS}
    noop: dict[str, list[float]] = {pool: [] for pool in POOLS}
    with db.connect(settings.database_url) as conn:
        for _ in range(runs):
            for pool in POOLS:
                cpu[pool].append(
                    _pool_rate(conn, settings, pool, "crunch", [CRUNCH_ROUNDS], cpu_tasks, cores)
                )
                noop[pool].append(_pool_rate(conn, settings, pool, "noop", [], noop_tasks, 8))

    def figures(rates: dict[str, list[float]]) -> dict[str, Any]:
        medians = {pool: statistics.median(rates[pool]) for pool in POOLS}
        return {
            "tasks_per_s": {pool: round(medians[pool], 1) for pool in POOLS},
            "runs": {pool: [round(r, 1) for r in rates[pool]] for pool in POOLS},
            "processes_to_threads": round(medians["processes"] / medians["threads"], 3),
        }

    return {
        "params": {
            "cores": cores,
            "runs": runs,
            "cpu_bound_tasks": cpu_tasks,
            "crunch_rounds": CRUNCH_ROUNDS,
            "cpu_bound_concurrency": cores,
            "noop_tasks": noop_tasks,
            "noop_concurrency": 8,
        },
        "cpu_bound": figures(cpu),
        "noop": figures(noop),
        "goal": {"cpu_bound_processes_to_threads_at_least": 1.8},
    }


DATABASE = "rota_peer_pgqueuer"


async def _prepare(url: str, tasks: int) -> None:
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
        await queries.install()
        for i in range(0, tasks, 10_000):
            n = min(10_000, tasks - i)
            await queries.enqueue(["noop"] * n, [b"1"] * n, [0] * n)


async def _drain(url: str, batch_size: int) -> int:
    from pgqueuer import PgQueuer
    from pgqueuer.domain.types import QueueExecutionMode

    done = 0
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        pgq = PgQueuer.from_psycopg_connection(conn)

        @pgq.entrypoint("noop")
        async def noop(job: Any) -> None:
            nonlocal done
            done += 1

        await pgq.run(
            batch_size=batch_size,
            mode=QueueExecutionMode.drain,
            dequeue_timeout=timedelta(seconds=1),
        )
    return done


def _worker(args: tuple[str, int]) -> int:
    return asyncio.run(_drain(*args))


def pgqueuer_throughput(url: str, tasks: int, processes: int, batch_size: int) -> float:
    peer = fresh_database(url, DATABASE)
    asyncio.run(_prepare(peer, tasks))
    with warm_pool(processes, initializer=None) as pool:  # up before the clock starts
        started = time.perf_counter()
        done = sum(pool.map(_worker, [(peer, batch_size)] * processes))
        elapsed = time.perf_counter() - started
    return done / elapsed


PROCRASTINATE_DATABASE = "rota_peer_procrastinate"


def _procrastinate_app(url: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop", queue="bench")
    async def noop(i: int) -> None:
        return None

    return app


async def _procrastinate_prepare(url: str, tasks: int) -> None:
    app = _procrastinate_app(url)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        noop = app.tasks["noop"]
        for i in range(0, tasks, 5_000):
            await noop.batch_defer_async(*({"i": j} for j in range(i, min(tasks, i + 5_000))))


async def _procrastinate_drain(url: str, concurrency: int) -> None:
    app = _procrastinate_app(url)
    async with app.open_async():
        await app.run_worker_async(
            queues=["bench"],
            concurrency=concurrency,
            wait=False,
            install_signal_handlers=False,
            delete_jobs="always",
        )


def _procrastinate_worker(args: tuple[str, int]) -> None:
    asyncio.run(_procrastinate_drain(*args))


def procrastinate_throughput(url: str, tasks: int, processes: int, concurrency: int) -> float:
    peer = fresh_database(url, PROCRASTINATE_DATABASE)
    asyncio.run(_procrastinate_prepare(peer, tasks))
    with warm_pool(processes, initializer=None) as pool:
        started = time.perf_counter()
        pool.map(_procrastinate_worker, [(peer, concurrency)] * processes)
        elapsed = time.perf_counter() - started
    return tasks / elapsed
