"""`rota bench load --engine python|spark`: buffer -> PostgreSQL. The
sustained rate from a filled buffer, then enqueue -> claimable (and ->
committed) under a steady trickle with the loader running. Spark's runs
alternate with the Python loader's, with one and two processes, and with
the Spark loader's own executor code run without Spark, on the same tasks
and servers; its latency is read beside an empty micro-batch's (the floor,
rota_tools.bench.spark_stream)."""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rota import Settings
from rota.buffer import redis_client
from rota.core import db
from rota.loader import Loader
from rota_tools.bench.cpu import CpuMeter, machine_seconds, median_run, postgres_probe, redis_probe
from rota_tools.bench.harness import (
    WARM_UP,
    Backlog,
    Conn,
    bench_app,
    empty,
    even_tenant,
    p50_p99,
    ratio,
    ready,
    skewed_tenant,
    wait_for,
    warm_pool,
    warm_up,
)
from rota_tools.sql import query

TRICKLE = 20  # tasks an `enqueue_many` of the latency phase, every 20 ms


@dataclass
class Engines:
    """Each engine's rates over the runs, and the machine's CPU (every
    process: PostgreSQL, Redis, the loaders or Spark) per task, run by run:
    on cores that are all busy, what a task costs bounds the rate."""

    tasks: int
    rates: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cpu_us: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    # The Spark engine's own: each run's micro-batch sizes, the untimed
    # run's rate, and the JVM's warm-up.
    micro_batches: list[list[int]] = field(default_factory=list)
    warm_up_rate: float = 0.0
    jvm_warm_up: dict[str, Any] | None = None

    def add(self, engine: str, seconds: float, machine_cpu: float) -> float:
        self.rates[engine].append(self.tasks / seconds)
        self.cpu_us[engine].append(machine_cpu / self.tasks * 1e6)
        return self.tasks / seconds

    def median(self, engine: str) -> float:
        return statistics.median(self.rates[engine])

    def runs(self, engine: str) -> list[int]:
        return [round(r) for r in self.rates[engine]]


def _drain_worker(args: tuple[Settings, int]) -> tuple[int, float]:
    settings, number = args
    loader = Loader(settings, consumer=f"bench-loader-{number}")
    cpu = time.process_time()
    try:
        return loader.drain().loaded, time.process_time() - cpu
    finally:
        loader.close()


def drain(settings: Settings, conn: Conn, loaders: int) -> tuple[float, float, dict[str, Any]]:
    """Drains the buffer with `loaders` processes sharing the consumer group;
    the seconds it took, the machine's CPU seconds meanwhile, and the CPU
    by process (the loaders, PostgreSQL, Redis)."""
    Loader(settings).ensure_groups()
    client = redis_client.connect(settings)
    meter = CpuMeter({"postgresql": postgres_probe(conn), "redis": redis_probe(client)})
    with warm_pool(loaders) as pool:
        meter.start()
        cpu = machine_seconds()
        started = time.perf_counter()
        results = pool.map(_drain_worker, [(settings, n) for n in range(loaders)])
        elapsed, cpu = time.perf_counter() - started, machine_seconds() - cpu
    loaded = sum(n for n, _ in results)
    used = meter.report(elapsed, loaded, {"loader": sum(seconds for _, seconds in results)})
    client.close()
    return elapsed, cpu, used


def _python_run(backlog: Backlog, conn: Conn, engines: Engines, loaders: int) -> dict[str, Any]:
    """A run of `loaders` Python loaders from a full buffer; their CPU by process."""
    backlog.fill(conn)
    elapsed, machine, used = drain(backlog.settings, conn, loaders)
    engines.add(f"python_{loaders}_process", elapsed, machine)
    backlog.check_loaded(conn)
    return used


def _spark_runs(
    backlog: Backlog,
    conn: Conn,
    engines: Engines,
    spark: Any,
    checkpoints: str,
    runs: int,
    warm_up_batches: int,
) -> None:
    """Run by run: one and two Python loaders, the executors' code without
    Spark, then the Spark loader; with one untimed run of the whole backlog
    first (run -1: its executors' Python workers start, import and connect
    in their first), after `warm_up_batches` small micro-batches that warm
    the JVM."""
    from rota_tools.bench.spark_stream import (
        executor_processes,
        load_as_one_batch,
        sustained,
        warm_jvm,
    )

    settings = backlog.settings
    with executor_processes(settings.shards) as pool:
        if warm_up_batches > 0:
            empty(conn, settings)
            engines.jvm_warm_up = warm_jvm(
                backlog, spark, conn, f"{checkpoints}/warm-up", warm_up_batches
            )
        for run in range(-1, runs):
            for processes in (1, 2) if run >= 0 else ():
                _python_run(backlog, conn, engines, processes)
            # The executors' code, also in run -1: its processes import and
            # connect; a query key a run, as each Spark run is a query of its own.
            backlog.fill(conn)
            elapsed, cpu, stored = load_as_one_batch(
                settings, pool, f"{checkpoints}/executor-code-{run}", 0
            )
            assert stored == backlog.tasks, f"the executor code stored {stored} of {backlog.tasks}"
            if run >= 0:
                engines.add("spark_executor_code", elapsed, cpu)
            empty(conn, settings)
            elapsed, sizes, cpu = sustained(backlog, spark, conn, f"{checkpoints}/{run}")
            if run < 0:
                engines.warm_up_rate = backlog.tasks / elapsed
            else:
                engines.add("spark", elapsed, cpu)
                engines.micro_batches.append(sizes)
            backlog.check_loaded(conn, warm_up_tasks=1)


@contextlib.contextmanager
def _loader_running(settings: Settings, spark: Any, checkpoint: str) -> Iterator[Any]:
    """The engine's loader running while the block runs; yields Spark's
    micro-batch phases (None for the Python loader)."""
    stop, phases = threading.Event(), None
    if spark is None:
        loader = Loader(settings, consumer="bench-latency")
        runner = threading.Thread(target=loader.run_forever, args=(stop.is_set, 100))
    else:
        from rota_tools.bench.spark_stream import loader_thread, micro_batch_phases

        runner = loader_thread(settings, spark, checkpoint, stop)
        phases = micro_batch_phases()
        spark.streams.addListener(phases)
    runner.start()
    try:
        yield phases
    finally:
        stop.set()
        runner.join()
        if phases is not None:
            spark.streams.removeListener(phases)


def _trickle(
    backlog: Backlog, conn: Conn, spark: Any, checkpoint: str, seconds: float
) -> tuple[list[float], list[float] | None, dict[str, float] | None]:
    """Tasks trickle in at ~1,000/s for `seconds` with the loader running,
    from once it has loaded a task (Spark's first micro-batch is slow; that
    task is left out). Enqueue -> the load's start and -> its commit of
    each task (None where the server keeps no commit timestamps), and
    Spark's micro-batch phases."""
    empty(conn, backlog.settings)
    noop = backlog.app.tasks["noop"]
    with _loader_running(backlog.settings, spark, checkpoint) as phases:
        warm_up(backlog.app, conn)
        sent = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            tenant_of = backlog.tenant_of
            backlog.app.enqueue_many(
                [
                    noop.using(tenant=tenant_of(sent + k, backlog.tenants)).prepare(sent + k, "pad")
                    for k in range(TRICKLE)
                ]
            )
            sent += TRICKLE
            time.sleep(0.02)
        wait_for(lambda: ready(conn) >= sent + 1, 600, what="the trickle to be loaded", poll=0.1)
    started = [
        float(r[0]) for r in conn.execute(query("bench_load_latencies"), {"warm_up": WARM_UP})
    ]
    committed = None
    if conn.execute(query("bench_tracks_commit_timestamps")).fetchone() == ("on",):
        rows = conn.execute(query("bench_commit_latencies"), {"warm_up": WARM_UP})
        committed = [float(r[0]) for r in rows]
    return started, committed, phases.medians() if phases is not None else None


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
    spark = None
    if engine == "spark":
        from rota.loader.spark import spark_session

        spark = spark_session("local[*]", "rota-bench")
    app = bench_app(settings)
    backlog = Backlog(settings, app, tasks, tenants, even_tenant if even_tenants else skewed_tenant)
    engines = Engines(tasks)
    cpu: list[dict[str, Any]] = []
    with (
        db.connect(settings.database_url) as conn,
        # The Spark queries' checkpoints, one a run (the ledger is keyed by each).
        tempfile.TemporaryDirectory(prefix="rota-bench-ckpt-") as checkpoints,
    ):
        if spark is None:
            cpu = [_python_run(backlog, conn, engines, loaders) for _ in range(runs)]
        else:
            _spark_runs(backlog, conn, engines, spark, checkpoints, runs, spark_warm_up_batches)
        # The engine's last backlog, as loaded: its largest tenant's share.
        largest_share = conn.execute(query("bench_largest_tenant_share")).fetchone()
        started, committed, phases = _trickle(
            backlog, conn, spark, f"{checkpoints}/latency", trickle_seconds
        )
    app.close()
    floor = None
    if spark is not None:
        from rota.loader.spark import TRIGGER_SECONDS
        from rota_tools.bench.spark_stream import micro_batch_floor

        floor = micro_batch_floor(
            spark, settings.shards, TRIGGER_SECONDS, max(10.0, trickle_seconds)
        )
        spark.stop()
    rated = "spark" if spark is not None else f"python_{loaders}_process"
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
        "sustained_tasks_per_s": round(engines.median(rated)),
        "runs": engines.runs(rated),
        "backlog_largest_tenant_share": round(largest_share[0], 3) if largest_share else None,
        "machine_cpu_us_per_task": {
            name: round(statistics.median(runs_), 1) for name, runs_ in engines.cpu_us.items()
        },
        # The Python loaders' CPU by process (the median run's).
        **({"cpu": median_run(cpu)} if cpu else {}),
        **(_spark_figures(engines, phases, floor) if spark is not None else {}),
        # To the load transaction's start (the tasks' loaded_at): the tasks
        # are claimable at its commit, below where the server keeps commit
        # timestamps.
        "enqueue_to_claimable_ms": {**p50_p99(started, 2), "tasks": len(started)},
        **({"enqueue_to_committed_ms": p50_p99(committed, 2)} if committed else {}),
        "goal": {
            "python": {"tasks_per_s_at_least": 50_000, "p50_ms_at_most": 200},
            "spark": {
                "tasks_per_s_at_least": 50_000,
                "p50_ms_at_most": 200,
                "spark_to_two_python_loaders_at_least": 1.0,
            },
        }[engine],
    }


def _spark_figures(
    engines: Engines, phases: dict[str, float] | None, floor: dict[str, Any] | None
) -> dict[str, Any]:
    spark, code = engines.median("spark"), engines.median("spark_executor_code")

    def python(n: int) -> float:
        return engines.median(f"python_{n}_process")

    return {
        "micro_batch_tasks": engines.micro_batches,
        "jvm_warm_up": engines.jvm_warm_up,
        "warm_up_run_tasks_per_s": round(engines.warm_up_rate),
        "python_loader_tasks_per_s": {f"{n}_process": round(python(n)) for n in (1, 2)},
        "python_loader_runs": {f"{n}_process": engines.runs(f"python_{n}_process") for n in (1, 2)},
        "spark_to_two_python_loaders": ratio(spark, python(2)),
        "spark_to_one_python_loader": ratio(spark, python(1)),
        # The executors' code in plain processes, as local[*] runs its
        # tasks: Spark's own cost is the gap between it and the loader.
        "spark_executor_code_tasks_per_s": round(code),
        "spark_executor_code_runs": engines.runs("spark_executor_code"),
        "spark_to_its_executor_code": ratio(spark, code),
        "executor_code_to_two_python_loaders": ratio(code, python(2)),
        # Where a micro-batch's time goes under the trickle (Spark's
        # durationMs, medians over the batches that loaded tasks).
        "latency_micro_batch_ms": phases,
        # The same query reading and loading nothing: the least the
        # enqueue -> committed latency can be with Spark's batches here.
        "micro_batch_floor": floor,
    }
