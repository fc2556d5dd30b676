"""Benchmarks of the pipeline: enqueue into the buffer, buffer -> PostgreSQL, workers."""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import multiprocessing
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import psycopg

from rota import App, Settings, core
from rota.buffer import redis_client
from rota.buffer.streams import all_streams
from rota.core import db
from rota.loader import Loader
from rota.runtime.process import tune_gc
from rota_tools.bench.core import even_tenant, reset, skewed_tenant
from rota_tools.bench.cpu import (
    CpuMeter,
    Probe,
    machine_seconds,
    pid_probe,
    postgres_probe,
    redis_probe,
)
from rota_tools.bench.executor_code import executor_processes, load_as_one_batch
from rota_tools.bench.starts import offer, start_figures
from rota_tools.processes import spawn_loader, spawn_workers, stop_workers
from rota_tools.sql import query
from rota_tools.stats import percentile

QUEUE = "bench"
NOOP_APP = "rota_tools.bench.noop:app"
RESULT_PAIRS = 3  # `work`: alternating runs with results kept and without
WARM_UP = "warm-up"  # the tenant of the untimed task that shows a loader is up


def _app(settings: Settings) -> App:
    app = App(settings)
    app.task(name="noop", queue=QUEUE)(lambda i, pad: None)
    return app


def _flush_buffer(settings: Settings) -> None:
    client = redis_client.connect(settings)
    for stream in all_streams(settings.stream_prefix, settings.shards):
        client.delete(stream)  # one key per command: on a cluster, each its own slot
    client.close()


def _empty(conn: psycopg.Connection[Any], settings: Settings) -> None:
    """No task in PostgreSQL and none in the buffer: where each run starts."""
    reset(conn)
    _flush_buffer(settings)


def bench_enqueue(settings: Settings, tasks: int, tenants: int, runs: int) -> dict[str, Any]:

    app = _app(settings)
    noop = app.tasks["noop"]
    client = redis_client.connect(settings)
    many, plain = [], []
    for _ in range(runs):
        calls = [
            noop.using(tenant=skewed_tenant(i, tenants)).prepare(i, "payload-padding-abcdefghij")
            for i in range(tasks)
        ]
        _flush_buffer(settings)
        started = time.perf_counter()
        for i in range(0, tasks, 10_000):
            app.enqueue_many(calls[i : i + 10_000])
        many.append(tasks / (time.perf_counter() - started))
        # Baseline: plain redis-py pipelining, one XADD per task in 500s, of the
        # same (already built) envelopes: no validation, no batching.
        messages = [e.to_json() for e in app.batch(calls).envelopes()]
        _flush_buffer(settings)
        started = time.perf_counter()
        for i in range(0, tasks, 500):
            pipe = client.pipeline(transaction=False)
            for j, message in enumerate(messages[i : i + 500]):
                pipe.xadd(
                    f"{settings.stream_prefix}:{{{(i + j) % settings.shards}}}", {b"e": message}
                )
            pipe.execute()
        plain.append(tasks / (time.perf_counter() - started))
    _flush_buffer(settings)
    single = []
    for i in range(2000):
        started = time.perf_counter()
        noop.using(tenant=skewed_tenant(i, tenants)).enqueue(i, "payload-padding-abcdefghij")
        single.append((time.perf_counter() - started) * 1000)
    _flush_buffer(settings)
    app.close()
    client.close()

    down = _app(
        settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0", "redis_retries": 0})
    )
    down_noop = down.tasks["noop"]
    with db.connect(settings.database_url) as conn:
        reset(conn)
    fallback_calls = [
        down_noop.using(tenant=skewed_tenant(i, tenants)).prepare(i, "pad") for i in range(20_000)
    ]
    started = time.perf_counter()
    for i in range(0, len(fallback_calls), 5_000):
        down.enqueue_many(fallback_calls[i : i + 5_000])
    fallback = len(fallback_calls) / (time.perf_counter() - started)
    fallback_single = []
    for i in range(200):
        started = time.perf_counter()
        down_noop.using(tenant="single").enqueue(i, "pad")
        fallback_single.append((time.perf_counter() - started) * 1000)
    down.close()
    return {
        "params": {"tasks": tasks, "tenants": tenants, "runs": runs, "shards": settings.shards},
        "enqueue_many_tasks_per_s": round(statistics.median(many)),
        "plain_pipelined_xadd_tasks_per_s": round(statistics.median(plain)),
        "ratio_to_plain_pipelining": round(statistics.median(many) / statistics.median(plain), 3),
        "single_enqueue_ms": {
            "p50": round(statistics.median(single), 3),
            "p99": round(percentile(single, 0.99), 3),
        },
        "fallback_enqueue_many_tasks_per_s": round(fallback),
        "fallback_single_enqueue_ms": {
            "p50": round(statistics.median(fallback_single), 3),
            "p99": round(percentile(fallback_single, 0.99), 3),
        },
        "runs": {"enqueue_many": [round(r) for r in many], "plain": [round(r) for r in plain]},
        "goal": {"enqueue_many_tasks_per_s_at_least": 100_000, "single_p99_ms_at_most": 1.0},
    }


def _latencies(conn: psycopg.Connection[Any]) -> list[float]:
    rows = conn.execute(query("bench_load_latencies"), {"warm_up": WARM_UP}).fetchall()
    return [float(r[0]) for r in rows]


def _commit_latencies(conn: psycopg.Connection[Any]) -> list[float] | None:
    """Enqueue -> the load's commit, from the server's commit timestamps; None
    when it keeps none (track_commit_timestamp is off)."""
    if conn.execute(query("bench_tracks_commit_timestamps")).fetchone() != ("on",):
        return None
    rows = conn.execute(query("bench_commit_latencies"), {"warm_up": WARM_UP}).fetchall()
    return [float(r[0]) for r in rows]


def _warm_up(app: App, conn: psycopg.Connection[Any]) -> None:
    """Enqueues the warm-up task and waits until the running loader has loaded
    it: the loader is up (Spark's first micro-batch is slow)."""
    app.tasks["noop"].using(tenant=WARM_UP).enqueue(0, "warm-up")
    deadline = time.monotonic() + 120
    while db.run(conn, core.queue_counts()).get(QUEUE, {}).get("ready", 0) < 1:
        assert time.monotonic() < deadline, "the loader loaded nothing in 120 s"
        time.sleep(0.05)


def _spark_loader(
    settings: Settings, spark: Any, checkpoint: str, stop: threading.Event
) -> threading.Thread:
    """The streaming loader in a thread (not started), until `stop` is set,
    with `rota loader run`'s trigger."""
    from rota.loader.spark import run_streaming

    return threading.Thread(
        target=run_streaming,
        kwargs={
            "settings": settings,
            "checkpoint": checkpoint,
            "should_stop": stop.is_set,
            "session": spark,
        },
    )


def _micro_batch_phases() -> Any:
    """A streaming query listener that keeps the phases (latestOffset,
    walCommit, addBatch, commitOffsets, ...) of each micro-batch that read
    something; `medians()` gives each phase's median in ms."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class Phases(StreamingQueryListener):
        def __init__(self) -> None:
            self.batches: list[dict[str, int]] = []

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            if event.progress.numInputRows > 0:
                self.batches.append(dict(event.progress.durationMs))

        def medians(self) -> dict[str, float]:
            return phase_medians(self.batches) | {"batches": len(self.batches)}

    return Phases()


def phase_medians(batches: Sequence[Mapping[str, int]]) -> dict[str, float]:
    """Each phase's median over micro-batches' `durationMs` (a phase a batch
    did not report counts as 0 there)."""
    names = sorted({name for batch in batches for name in batch})
    return {name: statistics.median(b.get(name, 0) for b in batches) for name in names}


# Which tenant the i-th task of a bench's backlog belongs to, of `tenants`.
TenantOf = Callable[[int, int], str]


def _fill_buffer(app: App, tasks: int, tenants: int, tenant_of: TenantOf = skewed_tenant) -> None:
    noop = app.tasks["noop"]
    for i in range(0, tasks, 10_000):
        app.enqueue_many(
            [
                noop.using(tenant=tenant_of(j, tenants)).prepare(j, "pad")
                for j in range(i, min(tasks, i + 10_000))
            ]
        )


@contextlib.contextmanager
def _streaming(settings: Settings, spark: Any, checkpoint: str) -> Iterator[str]:
    """A loader query running on `checkpoint` while the block runs; yields
    the checkpoint as resolved once, the key of its ledger rows."""
    from rota.loader.spark import checkpoint_location

    stop = threading.Event()
    checkpoint = checkpoint_location(checkpoint)
    streaming = _spark_loader(settings, spark, checkpoint, stop)
    streaming.start()
    try:
        yield checkpoint
    finally:
        stop.set()
        streaming.join()


def _until_loaded(
    conn: psycopg.Connection[Any], checkpoint: str, tasks: int, poll: float, timeout: float
) -> None:
    """Until the query's ledger counts `tasks` (it commits with the tasks):
    0.2 ms a poll, where counting ready tasks took 30 ms while a batch's
    uncommitted rows were in the index (PostgreSQL's time, on two cores)."""
    deadline = time.monotonic() + timeout
    while sum(_micro_batch_tasks(conn, checkpoint)) < tasks:
        assert time.monotonic() < deadline, f"the loader did not load {tasks} tasks in {timeout} s"
        time.sleep(poll)


def _spark_sustained(
    settings: Settings,
    app: App,
    spark: Any,
    conn: psycopg.Connection[Any],
    tasks: int,
    tenants: int,
    checkpoint: str,
    tenant_of: TenantOf = skewed_tenant,
) -> tuple[float, list[int], float]:
    """The streaming query runs first (its start-up is not the steady rate), then
    the backlog appears in the buffer at once, as it does for the Python engine
    (which starts on a filled buffer): it is enqueued into streams the query
    does not read and renamed onto its shards in one MULTI. The clock runs
    until every task is claimable. Returns tasks/s, the micro-batch sizes and
    the machine's CPU seconds meanwhile."""
    filling = settings.model_copy(update={"stream_prefix": f"{settings.stream_prefix}-fill"})
    fill_app = _app(filling)
    client = redis_client.connect(settings)
    try:
        with _streaming(settings, spark, checkpoint) as checkpoint:
            _warm_up(app, conn)
            _fill_buffer(fill_app, tasks, tenants, tenant_of)
            # One MULTI on a single Redis; a cluster cannot span slots in one.
            pipe = client.pipeline(transaction=not redis_client.is_cluster_client(client))
            for staged, live in zip(
                all_streams(filling.stream_prefix, filling.shards),
                all_streams(settings.stream_prefix, settings.shards),
                strict=True,
            ):
                if client.exists(staged):  # a shard no tenant of the backlog maps to has none
                    # (The command, not the method: a cluster pipeline refuses `rename`,
                    # whose two keys here share their shard's slot.)
                    pipe.execute_command("RENAME", staged, live)
            cpu = machine_seconds()
            started = time.perf_counter()
            pipe.execute()
            _until_loaded(conn, checkpoint, tasks + 1, poll=0.02, timeout=600)
            elapsed = time.perf_counter() - started
            cpu = machine_seconds() - cpu
    finally:
        fill_app.close()
        client.close()
    return tasks / elapsed, [n for n in _micro_batch_tasks(conn, checkpoint) if n > 0], cpu


# The tasks of each micro-batch a Spark bench runs first, untimed
# (`--spark-warm-up-batches`): the JVM compiles the micro-batch's own paths
# (planning, scheduling, checkpointing) over its first tens of batches,
# whatever their size, and a long-running loader is past that (the JVM's
# CPU a batch before and after: docs/explanation/benchmarks.md).
WARM_UP_BATCH_TASKS = 2_000


def _warm_jvm(
    settings: Settings,
    app: App,
    spark: Any,
    conn: psycopg.Connection[Any],
    checkpoint: str,
    batches: int,
) -> dict[str, Any]:
    """Runs a loader query over `batches` micro-batches, each waiting for the
    one before to be loaded; their count and seconds."""
    noop = app.tasks["noop"]
    started = time.perf_counter()
    with _streaming(settings, spark, checkpoint) as checkpoint:
        for batch in range(batches):
            first = batch * WARM_UP_BATCH_TASKS
            app.enqueue_many(
                [
                    noop.using(tenant=skewed_tenant(k, 1000)).prepare(k, "pad")
                    for k in range(first, first + WARM_UP_BATCH_TASKS)
                ]
            )
            _until_loaded(conn, checkpoint, first + WARM_UP_BATCH_TASKS, poll=0.005, timeout=120)
    loaded = _micro_batch_tasks(conn, checkpoint)
    return {
        "micro_batches": len([n for n in loaded if n > 0]),
        "tasks": sum(loaded),
        "seconds": round(time.perf_counter() - started, 1),
    }


def _micro_batch_tasks(conn: psycopg.Connection[Any], checkpoint: str) -> list[int]:
    """The tasks each micro-batch of the query stored, in order (its loader ledger)."""
    rows = conn.execute(query("bench_loader_batches"), {"query": checkpoint}).fetchall()
    return [row[0] for row in rows]


def _drain_worker(args: tuple[Settings, int]) -> int:
    settings, number = args
    loader = Loader(settings, consumer=f"bench-loader-{number}")
    try:
        return loader.drain().loaded
    finally:
        loader.close()


def _parallel_drain(settings: Settings, loaders: int) -> tuple[float, float]:
    """Drains the buffer with `loaders` processes sharing the consumer group;
    returns the seconds it took and the machine's CPU seconds meanwhile."""
    Loader(settings).ensure_groups()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(loaders, initializer=tune_gc) as pool:
        pool.map(time.sleep, [0.0] * loaders)  # processes up before the clock starts
        cpu = machine_seconds()
        started = time.perf_counter()
        pool.map(_drain_worker, [(settings, n) for n in range(loaders)])
        return time.perf_counter() - started, machine_seconds() - cpu


def bench_pipeline_load(
    settings: Settings,
    engine: str,
    tasks: int,
    tenants: int,
    runs: int,
    loaders: int = 2,
    trickle_seconds: float = 5.0,
    spark_warm_up_batches: int = 0,
    even_tenants: bool = False,
) -> dict[str, Any]:
    """Sustained buffer -> PostgreSQL tasks/s (buffer filled first), then the
    enqueue -> claimable latency under a steady trickle with the loader running.
    The tasks' tenants: one holds half of them, or with `even_tenants` each
    an equal share."""
    tenant_of = even_tenant if even_tenants else skewed_tenant
    app = _app(settings)
    noop = app.tasks["noop"]
    rates = []
    micro_batches: list[list[int]] = []
    spark = None
    if engine == "spark":
        from rota.loader.spark import spark_session

        spark = spark_session("local[*]", "rota-bench")
    warm_up_rate = 0.0
    # Beside the Spark loader, in the same run: the Python loader with one and
    # with two processes, on the same tasks and servers.
    python_rates: dict[int, list[float]] = {1: [], 2: []}
    # And the Spark loader's own executor code without Spark, run for run.
    code_rates: list[float] = []
    # The machine's CPU per task of each engine (every process: PostgreSQL,
    # Redis, the loaders or Spark), run by run: on cores that are all busy,
    # what a task costs bounds the rate.
    cpu_per_task: dict[str, list[float]] = {}

    def spent(engine_name: str, seconds: float) -> None:
        cpu_per_task.setdefault(engine_name, []).append(seconds / tasks * 1e6)

    jvm_warm_up = None
    with (
        db.connect(settings.database_url) as conn,
        # The Spark queries' checkpoints, one a run (the ledger is keyed by each).
        tempfile.TemporaryDirectory(prefix="rota-bench-ckpt-") as checkpoints,
        executor_processes(settings.shards)
        if engine == "spark"
        else contextlib.nullcontext() as pool,
    ):
        if engine == "spark" and spark_warm_up_batches > 0:
            _empty(conn, settings)
            jvm_warm_up = _warm_jvm(
                settings, app, spark, conn, f"{checkpoints}/warm-up", spark_warm_up_batches
            )
        # Spark also gets one untimed run of the whole backlog (run -1): its
        # executors' Python workers start, import and connect in their first.
        for run in range(-1 if engine == "spark" else 0, runs):
            if engine == "spark" and run >= 0:
                for processes, measured in python_rates.items():
                    _empty(conn, settings)
                    _fill_buffer(app, tasks, tenants, tenant_of)
                    elapsed, cpu = _parallel_drain(settings, processes)
                    measured.append(tasks / elapsed)
                    spent(f"python_{processes}_process", cpu)
                    assert db.run(conn, core.queue_counts())[QUEUE]["ready"] == tasks
            if pool is not None:  # also in run -1: its processes import and connect
                _empty(conn, settings)
                _fill_buffer(app, tasks, tenants, tenant_of)
                # A key a run, as each Spark run is a query of its own.
                key = f"{checkpoints}/executor-code-{run}"
                elapsed, cpu, stored = load_as_one_batch(settings, pool, key, 0)
                assert stored == tasks, f"the executor code stored {stored} of {tasks}"
                if run >= 0:
                    code_rates.append(tasks / elapsed)
                    spent("spark_executor_code", cpu)
            _empty(conn, settings)
            if engine == "python":
                _fill_buffer(app, tasks, tenants, tenant_of)
                elapsed, cpu = _parallel_drain(settings, loaders)
                rates.append(tasks / elapsed)
                spent(f"python_{loaders}_process", cpu)
            else:
                rate, sizes, cpu = _spark_sustained(
                    settings, app, spark, conn, tasks, tenants, f"{checkpoints}/{run}", tenant_of
                )
                if run < 0:
                    warm_up_rate = rate
                else:
                    rates.append(rate)
                    spent("spark", cpu)
                    micro_batches.append(sizes)
            warm_up = 1 if engine == "spark" else 0
            assert db.run(conn, core.queue_counts())[QUEUE]["ready"] == tasks + warm_up
        # The engine's last backlog, as loaded: its largest tenant's share.
        largest_share = conn.execute(query("bench_largest_tenant_share")).fetchone()

        # Latency: the loader runs; tasks trickle in at ~1,000/s for `trickle_seconds`.
        _empty(conn, settings)
        stop = threading.Event()
        phases = None
        if engine == "python":
            loader = Loader(settings, consumer="bench-latency")
            runner = threading.Thread(target=loader.run_forever, args=(stop.is_set, 100))
        else:
            runner = _spark_loader(settings, spark, f"{checkpoints}/latency", stop)
            phases = _micro_batch_phases()
            assert spark is not None
            spark.streams.addListener(phases)
        runner.start()
        try:
            # The trickle starts once the loader has loaded a task (Spark's
            # first micro-batch is slow); that task is left out of the latencies.
            _warm_up(app, conn)
            sent = 0
            deadline = time.monotonic() + trickle_seconds
            while time.monotonic() < deadline:
                app.enqueue_many(
                    [
                        noop.using(tenant=tenant_of(sent + k, tenants)).prepare(sent + k, "pad")
                        for k in range(20)
                    ]
                )
                sent += 20
                time.sleep(0.02)
            while db.run(conn, core.queue_counts()).get(QUEUE, {}).get("ready", 0) < sent + 1:
                time.sleep(0.1)
        finally:
            stop.set()
            runner.join()
        if phases is not None:
            assert spark is not None
            spark.streams.removeListener(phases)
        latencies = _latencies(conn)
        committed = _commit_latencies(conn)
    app.close()
    floor = None
    if spark is not None:
        from rota.loader.spark import TRIGGER_SECONDS
        from rota_tools.bench.spark_floor import micro_batch_floor

        floor = micro_batch_floor(
            spark, settings.shards, TRIGGER_SECONDS, max(10.0, trickle_seconds)
        )
        spark.stop()
    return {
        "params": {
            "engine": engine,
            "tasks": tasks,
            "tenants": tenants,
            "runs": runs,
            "loaders": loaders if engine == "python" else 1,
            "trickle_seconds": trickle_seconds,
            "even_tenants": even_tenants,
            **({"spark_warm_up_batches": spark_warm_up_batches} if engine == "spark" else {}),
        },
        "sustained_tasks_per_s": round(statistics.median(rates)),
        "runs": [round(r) for r in rates],
        "backlog_largest_tenant_share": round(largest_share[0], 3) if largest_share else None,
        "machine_cpu_us_per_task": {
            name: round(statistics.median(runs_), 1) for name, runs_ in cpu_per_task.items()
        },
        **(
            {
                "micro_batch_tasks": micro_batches,
                "jvm_warm_up": jvm_warm_up,
                "warm_up_run_tasks_per_s": round(warm_up_rate),
                "python_loader_tasks_per_s": {
                    f"{n}_process": round(statistics.median(r)) for n, r in python_rates.items()
                },
                "python_loader_runs": {
                    f"{n}_process": [round(x) for x in r] for n, r in python_rates.items()
                },
                "spark_to_two_python_loaders": round(
                    statistics.median(rates) / statistics.median(python_rates[2]), 3
                ),
                "spark_to_one_python_loader": round(
                    statistics.median(rates) / statistics.median(python_rates[1]), 3
                ),
                # The executors' code in plain processes, as local[*] runs its
                # tasks: Spark's own cost is the gap between it and the loader.
                "spark_executor_code_tasks_per_s": round(statistics.median(code_rates)),
                "spark_executor_code_runs": [round(r) for r in code_rates],
                "spark_to_its_executor_code": round(
                    statistics.median(rates) / statistics.median(code_rates), 3
                ),
                "executor_code_to_two_python_loaders": round(
                    statistics.median(code_rates) / statistics.median(python_rates[2]), 3
                ),
                # Where a micro-batch's time goes under the trickle (Spark's
                # durationMs, medians over the batches that loaded tasks).
                "latency_micro_batch_ms": phases.medians() if phases else None,
                # The same query reading and loading nothing: the least the
                # enqueue -> committed latency can be with Spark's batches here.
                "micro_batch_floor": floor,
            }
            if engine == "spark"
            else {}
        ),
        # To the load transaction's start (the tasks' loaded_at): the tasks
        # are claimable at its commit, below where the server keeps commit
        # timestamps.
        "enqueue_to_claimable_ms": {
            "p50": round(statistics.median(latencies), 2),
            "p99": round(percentile(latencies, 0.99), 2),
            "tasks": len(latencies),
        },
        **(
            {
                "enqueue_to_committed_ms": {
                    "p50": round(statistics.median(committed), 2),
                    "p99": round(percentile(committed, 0.99), 2),
                }
            }
            if committed
            else {}
        ),
        "goal": {
            "python": {"tasks_per_s_at_least": 50_000, "p50_ms_at_most": 200},
            "spark": {
                "tasks_per_s_at_least": 50_000,
                "p50_ms_at_most": 200,
                "spark_to_two_python_loaders_at_least": 1.0,
            },
        }[engine],
    }


def _start_latencies(conn: psycopg.Connection[Any]) -> list[float]:
    """Enqueue -> start of every finished task, in milliseconds."""
    rows = conn.execute(query("bench_start_latencies")).fetchall()
    return [float(r[0]) for r in rows]


def _finished(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute(query("bench_finished_count")).fetchone()[0])  # type: ignore[index]


def _wait_for_finished(
    conn: psycopg.Connection[Any],
    count: int,
    processes: Sequence[subprocess.Popen[bytes]],
    drained: bool = False,
) -> None:
    """Until `count` tasks finished; raises if a process doing the work exited
    (a run would otherwise wait for ever). `drained`: `count` is every task
    of the run, counted only once none waits or runs."""
    statement = query("bench_finished_when_drained") if drained else query("bench_finished_count")
    while True:
        row = conn.execute(statement).fetchone()
        if row is not None and row[0] is not None and row[0] >= count:
            return
        for process in processes:
            if process.poll() is not None:
                args = process.args
                command = " ".join(map(str, args)) if isinstance(args, list) else str(args)
                raise RuntimeError(
                    f"benchmark: `{command}` exited with {process.returncode} "
                    f"before {count} tasks finished"
                )
        time.sleep(0.05)


def _live_workers(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute(query("bench_live_workers")).fetchone()[0])  # type: ignore[index]


def bench_work(settings: Settings, tasks: int, tenants: int, concurrency: int) -> dict[str, Any]:
    from rota.model.envelope import make_envelope

    throughput: dict[str, list[float]] = collections.defaultdict(list)
    # The default (reports need no WAL flush), then reports waiting for it, as
    # the peers' do (ROTA_WORKER_SYNCHRONOUS_COMMIT=true).
    runs = [(str(n), n, settings, "noop") for n in (1, 2)] + [
        (
            f"{n}_synchronous_commit",
            n,
            settings.model_copy(update={"worker_synchronous_commit": True}),
            "noop",
        )
        for n in (1, 2)
    ]
    # One process with each run's result kept (`result_ttl`) and without,
    # alternating, RESULT_PAIRS times: their ratio is this scenario's
    # smallest effect, and the machine's noise between two runs is larger.
    for _ in range(RESULT_PAIRS):
        runs += [("1_results", 1, settings, "noop_result"), ("1", 1, settings, "noop")]
    with db.connect(settings.database_url) as conn:
        for key, processes, run_settings, name in runs:
            reset(conn)
            for i in range(0, tasks, 10_000):
                db.transact(
                    conn,
                    core.load(
                        [
                            make_envelope(
                                name=name, queue=QUEUE, tenant=skewed_tenant(j, tenants), args=[j]
                            )
                            for j in range(i, min(tasks, i + 10_000))
                        ]
                    ),
                )
            workers = spawn_workers(
                NOOP_APP, [QUEUE], processes, run_settings, concurrency=concurrency, batch_size=100
            )
            try:
                _wait_for_finished(conn, 100, workers)  # workers up and running
                begin_count, started = _finished(conn), time.perf_counter()
                _wait_for_finished(conn, tasks, workers, drained=True)
                throughput[key].append((tasks - begin_count) / (time.perf_counter() - started))
            finally:
                stop_workers(workers)

        # Start latency: idle workers, one task at a time, woken by NOTIFY.
        reset(conn)
        workers = spawn_workers(
            NOOP_APP, [QUEUE], 1, settings, concurrency=concurrency, batch_size=100
        )
        try:
            deadline = time.monotonic() + 60
            while conn.execute(query("bench_listening")).fetchone() != (1,):  # up and listening
                assert time.monotonic() < deadline, "the worker did not LISTEN within 60 s"
                time.sleep(0.05)
            for i in range(60):
                db.transact(
                    conn, core.load([make_envelope(name="noop", queue=QUEUE, tenant="t", args=[i])])
                )
                time.sleep(0.05)
            _wait_for_finished(conn, 60, workers)
            starts = _start_latencies(conn)
            gets = _result_latencies(conn, settings)
        finally:
            stop_workers(workers)
    rate = {key: statistics.median(rates) for key, rates in throughput.items()}
    figures: dict[str, Any] = {
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
        "enqueue_to_start_ms": start_figures(starts),
        "results": {
            "tasks_per_s_1_process": round(rate["1_results"]),
            # Medians of the alternating runs; None when a run too small to
            # time left nothing to divide by.
            "ratio_to_without": (round(rate["1_results"] / rate["1"], 3) if rate["1"] else None),
            "pairs": RESULT_PAIRS,
            # From the completion's transaction to get() returning, in a
            # process waiting on it meanwhile (woken by NOTIFY).
            "get_after_end_ms": start_figures(gets),
        },
        "goal": {"start_p50_ms_at_most": 50, "ratio_to_pgqueuer_at_least": 2.0},
    }
    if importlib.util.find_spec("pgqueuer") is not None:
        from rota_tools.bench.peers import pgqueuer_throughput

        peer = {
            f"{n}_process": pgqueuer_throughput(settings.database_url, tasks, n, 100)
            for n in (1, 2)
        }
        figures["pgqueuer_tasks_per_s"] = {k: round(v) for k, v in peer.items()}
        figures["ratio_to_pgqueuer"] = {
            k: round(rate[k.split("_")[0]] / v, 2) for k, v in peer.items()
        }
        figures["synchronous_commit_ratio_to_pgqueuer"] = {
            k: round(rate[k.split("_")[0] + "_synchronous_commit"] / v, 2) for k, v in peer.items()
        }
    else:
        figures["pgqueuer_tasks_per_s"] = "not installed (pip install 'rota[bench]')"
    if importlib.util.find_spec("procrastinate") is not None:
        from rota_tools.bench.peers import procrastinate_throughput

        # Far slower per job: a smaller run keeps the benchmark short.
        peer_tasks = min(tasks, 5_000)
        peer = {
            f"{n}_process": procrastinate_throughput(
                settings.database_url, peer_tasks, n, concurrency
            )
            for n in (1, 2)
        }
        figures["procrastinate_tasks_per_s"] = {k: round(v) for k, v in peer.items()}
        figures["procrastinate_tasks"] = peer_tasks
        figures["ratio_to_procrastinate"] = {
            k: round(rate[k.split("_")[0]] / v, 2) for k, v in peer.items()
        }
    return figures


def _result_latencies(
    conn: psycopg.Connection[Any], settings: Settings, runs: int = 40
) -> list[float]:
    """Loads one task that keeps its result at a time and waits for it from
    here (an idle worker runs it); ms from its completion's transaction to
    get() returning."""
    from rota.model.envelope import make_envelope
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


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"benchmark: {what} within {timeout:g} s")
        time.sleep(0.05)


def bench_end_to_end(
    settings: Settings,
    tasks: int,
    tenants: int,
    rate: float,
    concurrency: int,
    fleet: Settings | None = None,
    probes: dict[str, Probe] | None = None,
) -> dict[str, Any]:
    """The whole pipeline as deployed, each part its own process: a producer
    at a steady rate (this process) -> Redis -> a Python loader -> 2 worker
    processes. Enqueue -> start latency, throughput, and the CPU each used.
    The loader and workers run with `fleet` (a pooler's URL, say) when given;
    `probes` add processes to the CPU report."""
    fleet = fleet or settings
    app = _app(settings)
    noop = app.tasks["noop"]
    client = redis_client.connect(settings)
    with db.connect(settings.database_url) as conn:
        _empty(conn, settings)
        loader = spawn_loader(fleet)
        workers = spawn_workers(
            NOOP_APP, [QUEUE], 2, fleet, concurrency=concurrency, batch_size=100
        )
        try:
            # One task through the whole pipeline: every process is up. It is
            # then forgotten, as the first task of a cold pipeline says nothing
            # of the steady state.
            _wait_until(lambda: _live_workers(conn) == len(workers), "the workers register")
            probe = noop.using(tenant="bench-warm-up").enqueue(-1, "warm-up")
            _wait_until(lambda: _finished(conn) == 1, "a first task runs")
            conn.execute(query("bench_forget_finished"), {"id": probe})
            meter = CpuMeter(
                {
                    "producer": pid_probe(os.getpid()),
                    "loader": pid_probe(loader.pid),
                    **{f"worker_{n}": pid_probe(w.pid) for n, w in enumerate(workers, 1)},
                    "postgresql": postgres_probe(conn),
                    "redis": redis_probe(client),
                    **(probes or {}),
                }
            )
            meter.start()
            started = offer(
                tasks,
                rate,
                lambda first, n: app.enqueue_many(
                    [
                        noop.using(tenant=skewed_tenant(i, tenants)).prepare(i, "pad")
                        for i in range(first, first + n)
                    ]
                ),
            )
            _wait_for_finished(conn, tasks, [loader, *workers], drained=True)
            elapsed = time.perf_counter() - started
            cpu = meter.report(elapsed, tasks)
        finally:
            stop_workers([loader, *workers])
        starts = _start_latencies(conn)
    app.close()
    client.close()
    return {
        "params": {
            "tasks": tasks,
            "tenants": tenants,
            "offered_rate": rate,
            "concurrency": concurrency,
            "workers": 2,
            "loader": "python",
            "database_pooling": fleet.database_pooling,
            "listen": fleet.session_database_url is not None,
        },
        "tasks_per_s": round(tasks / elapsed),
        "enqueue_to_start_ms": start_figures(starts),
        "cpu": cpu,
    }
