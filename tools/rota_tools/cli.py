"""`rota bench` and `rota demo`: registered with the `rota` command through the
`rota.commands` entry points (pyproject.toml); nothing in rota imports this."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import psycopg
import typer

from rota.cli.app import DatabaseUrl, RedisUrl
from rota.runtime.process import tune_gc
from rota.settings import Settings
from rota_tools.bench.compare import DEFAULT_STAGES, STAGES
from rota_tools.bench.harness import BENCH_POSTGRES, bench_settings, stamped

bench_app = typer.Typer(help="Benchmarks; JSON figures with their baselines.", no_args_is_help=True)


def _report(scenario: str, figures: dict[str, Any], as_json: bool) -> None:
    report = stamped(scenario, figures)
    if as_json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for key, value in report.items():
            typer.echo(f"{key}: {value}")


Local = Annotated[
    bool | None,
    typer.Option(
        "--local/--no-local", help="start a throwaway PostgreSQL (default when no URL is set)"
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="print the figures as JSON")]
BesideCluster = Annotated[
    bool,
    typer.Option(
        "--redis-cluster",
        help="run again on a throwaway three-master Redis Cluster (same PostgreSQL) "
        "and report both, with the cluster's ratios",
    ),
]
Statements = Annotated[
    bool,
    typer.Option(
        "--statements",
        help="start the throwaway PostgreSQL with pg_stat_statements and report "
        "its busiest statements per task",
    ),
]
Measure = Callable[..., dict[str, Any]]
# The options of a scenario on the bench's servers (bench_settings), after its own.
SERVERS: dict[str, tuple[Any, Any]] = {
    "database_url": (DatabaseUrl, None),
    "redis_url": (RedisUrl, None),
    "local": (Local, None),
    "statements": (Statements, False),
    "as_json": (AsJson, False),
}


def _scenario(
    name: str,
    *,
    redis: bool = True,
    statements: bool = False,
    gc: bool = False,
    check: Callable[..., None] | None = None,
    postgres: Callable[..., dict[str, str]] | None = None,
) -> Callable[[Measure], Measure]:
    """Registers `measure(settings, **options) -> figures` as `rota bench
    NAME`, with its options and SERVERS' (--redis-url with `redis`,
    --statements with `statements`). The command runs `check(**options)`,
    then tune_gc() with `gc` (as the process it measures does), then
    `measure` on bench_settings' servers (a throwaway PostgreSQL started
    with `postgres(**options)`'s settings too), and reports its figures."""
    taken = [
        k for k in SERVERS if (redis or k != "redis_url") and (statements or k != "statements")
    ]

    def register(measure: Measure) -> Measure:
        def command(**options: Any) -> None:
            database_url, redis_url, local, with_statements, as_json = (
                options.pop(key, SERVERS[key][1]) for key in SERVERS
            )
            if check is not None:
                check(**options)
            if gc:
                tune_gc()
            server = postgres(**options) if postgres is not None else None
            with bench_settings(
                database_url, redis_url, local, with_statements, server
            ) as settings:
                _report(name, measure(settings, **options), as_json)

        keyword = inspect.Parameter.KEYWORD_ONLY
        own = list(inspect.signature(measure, eval_str=True).parameters.values())[1:]
        every = [p.replace(kind=keyword) for p in own]
        every += [
            inspect.Parameter(k, keyword, annotation=SERVERS[k][0], default=SERVERS[k][1])
            for k in taken
        ]
        command.__signature__ = inspect.Signature(every)  # type: ignore[attr-defined]
        command.__doc__ = measure.__doc__
        bench_app.command(name)(command)
        return measure

    return register


def _beside_cluster(
    settings: Settings, measure: Callable[[Settings], dict[str, Any]], cluster: bool
) -> dict[str, Any]:
    """`measure`'s figures; with `cluster`, also on a three-master cluster in
    the same run, and each rate's ratio cluster / single Redis."""
    from rota_tools.devservers import local_redis_cluster

    single = measure(settings)
    if not cluster:
        return single
    with local_redis_cluster(masters=3) as started:
        clustered = measure(settings.model_copy(update={"redis_url": started.url}))
    ratios = {
        key: round(clustered[key] / value, 3)
        for key, value in single.items()
        if key.endswith("per_s") and isinstance(value, int | float) and value
    }
    return {**single, "redis_cluster": clustered, "redis_cluster_ratio": ratios}


def _check_load(engine: str, connections: int, **_: Any) -> None:
    if connections < 1 or (connections > 1 and engine != "core"):
        raise typer.BadParameter("--connections takes 1 or more, with --engine core")


# As in `rota loader` (and its Python loaders' processes).
@_scenario("load", statements=True, gc=True, check=_check_load)
def bench_load(
    settings: Settings,
    engine: Annotated[str, typer.Option(help="core (bulk SQL vs raw COPY), python or spark")] = (
        "core"
    ),
    tasks: int = 200_000,
    loaders: Annotated[int, typer.Option(help="python engine: loader processes")] = 2,
    connections: Annotated[
        int,
        typer.Option(
            help="core engine: also load one queue from N processes at once, each with its "
            "own tenants, beside one process loading the same batches"
        ),
    ] = 1,
    tenants: int = 1000,
    runs: int = 3,
    trickle_seconds: Annotated[
        float, typer.Option(help="python/spark: the latency phase's trickle (1,000 tasks/s)")
    ] = 5.0,
    spark_warm_up_batches: Annotated[
        int,
        typer.Option(
            help="spark: untimed micro-batches of 2,000 tasks first, while the JVM compiles "
            "its per-batch paths (a long-running loader is past that)"
        ),
    ] = 80,
    even_tenants: Annotated[
        bool,
        typer.Option(
            help="python/spark: each tenant an equal share of the tasks (by default one "
            "tenant holds half)"
        ),
    ] = False,
    redis_cluster: BesideCluster = False,
) -> dict[str, Any]:
    """Loading: the core's fair bulk load vs raw COPY (--engine core), or the
    buffer -> PostgreSQL pipeline's tasks/s and enqueue -> claimable latency."""
    from rota_tools.bench.load import bench_pipeline_load
    from rota_tools.bench.load_core import bench_load as run_core
    from rota_tools.bench.load_core import bench_parallel_load

    if engine == "core":
        figures = run_core(settings.database_url, tasks, tenants, runs)
        if connections > 1:
            figures["parallel"] = bench_parallel_load(
                settings.database_url, tasks, tenants, connections, runs
            )
        return figures
    if engine not in ("python", "spark"):
        raise typer.BadParameter(f"unknown engine {engine!r}")
    options = (loaders, trickle_seconds, spark_warm_up_batches, even_tenants)
    measure = lambda s: bench_pipeline_load(s, engine, tasks, tenants, runs, *options)  # noqa: E731
    return _beside_cluster(settings, measure, redis_cluster)


@_scenario("enqueue")
def bench_enqueue(
    settings: Settings,
    tasks: int = 200_000,
    tenants: int = 1000,
    runs: int = 3,
    redis_cluster: BesideCluster = False,
) -> dict[str, Any]:
    """Producer: enqueue_many and single enqueue into the buffer, and the fallback."""
    from rota_tools.bench.enqueue import bench_enqueue as run

    return _beside_cluster(settings, lambda s: run(s, tasks, tenants, runs), redis_cluster)


@_scenario("import", redis=False)
def bench_import_command(
    settings: Settings,
    rows: int = 1_000_000,
    tenants: int = 1000,
    runs: int = 1,
    master: Annotated[str, typer.Option(help="Spark master URL")] = "local[*]",
    spark_cluster: Annotated[
        bool,
        typer.Option(
            "--spark-cluster", help="on a throwaway standalone cluster (a master, two workers)"
        ),
    ] = False,
) -> dict[str, Any]:
    """`rota import` of a generated Parquet file against, in the same run, a
    plain Spark JDBC write of the same rows and a COPY of them from one
    connection into a table with rota.tasks' indexes (the ceiling); the peak
    memory of the driver and of the executors' Python workers."""
    from rota_tools.bench.importing import bench_import
    from rota_tools.devservers import local_spark_cluster

    with contextlib.ExitStack() as stack:
        if spark_cluster:
            master = stack.enter_context(local_spark_cluster(workers=2, cores=1)).url
        return bench_import(settings, rows, tenants, runs, master)


@_scenario("workflow")
def bench_workflow_command(
    settings: Settings,
    tenants: Annotated[int, typer.Option(help="tenants, each a group with a join")] = 1000,
    members: Annotated[int, typer.Option(help="members of each small group")] = 100,
    big: Annotated[int, typer.Option(help="members of the one huge group (0: none)")] = 100_000,
    step_tasks: Annotated[int, typer.Option(help="tasks of the step-cost runs")] = 50_000,
    runs: int = 3,
) -> dict[str, Any]:
    """Workflows: every join runs once; small tenants' joins beside a huge
    group against alone; a member's cost against a plain task's."""
    from rota_tools.bench.workflow import bench_workflow

    return bench_workflow(settings, tenants, members, big, step_tasks, runs)


@_scenario("keyed-limits")
def bench_keyed_limits_command(
    settings: Settings,
    tasks: Annotated[int, typer.Option(help="unlimited no-op tasks per throughput run")] = 100_000,
    waiting: Annotated[int, typer.Option(help="tasks waiting on the saturated key")] = 10_000,
    limit: Annotated[int, typer.Option(help="the key's concurrency limit")] = 4,
    keyed: Annotated[int, typer.Option(help="keyed tasks run while the limit is sampled")] = 3000,
    runs: int = 3,
) -> dict[str, Any]:
    """Limits on keys: unlimited tasks beside 10,000 waiting on a saturated
    key against alone; the key's running count sampled under two workers."""
    from rota_tools.bench.keyed import bench_keyed_limits

    return bench_keyed_limits(settings, tasks, waiting, limit, keyed, runs)


@_scenario("runtime-fairness")
def bench_runtime_fairness_command(settings: Settings, runs: int = 3) -> dict[str, Any]:
    """Shares of worker time of a tenant with 100 ms tasks beside one with
    1 ms tasks: charged by measured time (equal weights, 2:1) and by count."""
    from rota_tools.bench.runtime import bench_runtime_fairness

    return bench_runtime_fairness(settings, runs)


def _check_work(pool: str, **_: Any) -> None:
    if pool not in ("threads", "processes"):
        raise typer.BadParameter(f"--pool is threads or processes, not {pool!r}")


@_scenario("work", check=_check_work)
def bench_work(
    settings: Settings,
    tasks: int = 50_000,
    tenants: int = 1000,
    concurrency: int = 8,
    pool: Annotated[
        str,
        typer.Option(
            help="processes: the process pool beside threads, on CPU-bound and no-op tasks"
        ),
    ] = "threads",
    runs: Annotated[int, typer.Option(help="alternating runs per pool (--pool processes)")] = 3,
    progress: Annotated[
        bool,
        typer.Option(
            help="each task reports its progress once (the A/B of progress): the JSON says "
            "how many progress writes the database saw"
        ),
    ] = False,
) -> dict[str, Any]:
    """No-op tasks through the worker runtime: tasks/s with 1 and 2 processes,
    and enqueue -> start latency with NOTIFY. With --pool processes: the
    process pool's tasks/s beside the thread pool's, CPU-bound and no-op.
    With --progress: tasks that report their progress, and its writes."""
    from rota_tools.bench.work import bench_pools
    from rota_tools.bench.work import bench_work as run

    if pool == "processes":
        return bench_pools(settings, min(tasks, 400), min(tasks, 20_000), runs)
    return run(settings, tasks, tenants, concurrency, progress)


def _fairness(
    scenario: str,
    settings: Settings,
    scale: Annotated[int, typer.Option(help="workload size multiplier")] = 100,
) -> dict[str, Any]:
    from rota_tools.bench.fairness import bench_fairness

    return bench_fairness(settings.database_url, scenario, scale)


for _name in ("noisy-neighbour", "zipf", "weighted", "cost"):
    _measure = functools.partial(_fairness, _name)
    _measure.__doc__ = f"Fairness: the {_name} workload through rota, FIFO and PARTITION BY."
    _scenario(_name, redis=False)(_measure)


@_scenario("end-to-end")
def bench_end_to_end(
    settings: Settings,
    tasks: int = 20_000,
    tenants: int = 100,
    rate: float = 2000.0,
    concurrency: int = 8,
    pgbouncer: Annotated[
        bool,
        typer.Option(
            "--pgbouncer",
            help="run again with the loader and workers behind a throwaway PgBouncer in "
            "transaction mode, with LISTEN on a direct URL and without (polling)",
        ),
    ] = False,
    tracing: Annotated[
        bool,
        typer.Option(
            "--tracing",
            help="OpenTelemetry tracing off and on, alternating --rounds times (needs "
            "rota[otel] and opentelemetry-sdk)",
        ),
    ] = False,
    rounds: Annotated[int, typer.Option(help="--tracing: runs of each")] = 3,
) -> dict[str, Any]:
    """Producer -> Redis -> Python loader -> 2 workers at a steady offered rate."""
    from rota_tools.bench.end_to_end import bench_end_to_end as run
    from rota_tools.bench.end_to_end import bench_tracing

    if tracing:
        return bench_tracing(settings, tasks, tenants, rate, concurrency, rounds)
    return run(settings, tasks, tenants, rate, concurrency, pgbouncer)


def _fleet_handlers(handlers: str) -> tuple[int, int]:
    from rota_tools.bench.fleet import parse_handlers

    try:
        return parse_handlers(handlers)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _check_fleet(handlers: str, systems: str, sweep_rates: str, **_: Any) -> None:
    from rota_tools.bench.fleet import parse_systems

    _fleet_handlers(handlers)
    try:
        parse_systems(systems)
        _rates(sweep_rates)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _rates(text: str) -> list[float]:
    rates = [float(r) for r in text.split(",") if r.strip()]
    if any(r <= 0 for r in rates):
        raise ValueError(f"--sweep-rates takes rates above 0, not {text!r}")
    return rates


def _fleet_postgres(handlers: str, **_: Any) -> dict[str, str]:
    """Room for a connection a handler thread, beside the workers' and the bench's."""
    processes, threads = _fleet_handlers(handlers)
    return {"max_connections": str(max(200, processes * threads + 100))}


@_scenario("fleet", check=_check_fleet, postgres=_fleet_postgres)
def bench_fleet(
    settings: Settings,
    handlers: Annotated[
        str, typer.Option(help="handler processes x threads each, e.g. 8x32 (256 handlers)")
    ] = "8x32",
    rate: Annotated[float, typer.Option(help="requests (tasks) per second, the fleet's")] = 2000.0,
    seconds: Annotated[float, typer.Option(help="length of each system's run")] = 10.0,
    stall_seconds: Annotated[
        float,
        typer.Option(help="PostgreSQL stopped this long in a run of its own (0: no stall run)"),
    ] = 3.0,
    systems: Annotated[
        str,
        typer.Option(
            help="comma-separated, of: rota, rota_direct, pgqueuer, procrastinate, "
            "insert_per_request"
        ),
    ] = "rota,rota_direct,pgqueuer,procrastinate,insert_per_request",
    sweep_rates: Annotated[
        str,
        typer.Option(
            help="the sweep's offered rates, comma-separated, tried upwards until the "
            "handlers' p99 passes 5 ms or a task is lost (empty: no sweep)"
        ),
    ] = "250,500,1000,2000,4000,8000",
    sweep_seconds: Annotated[float, typer.Option(help="length of each sweep run")] = 5.0,
) -> dict[str, Any]:
    """A web fleet enqueueing one task per request (Poisson arrivals, zipf
    tenants), through rota and through the queues that write each task to
    PostgreSQL as the request runs, one after another on the same servers:
    the handlers' enqueue latency, PostgreSQL's CPU per task, its wait
    events, and a stall of PostgreSQL."""
    from rota_tools.bench.fleet import bench_fleet as run
    from rota_tools.bench.fleet import parse_systems

    processes, threads = _fleet_handlers(handlers)
    return run(
        settings,
        processes,
        threads,
        rate,
        seconds,
        stall_seconds,
        parse_systems(systems),
        _rates(sweep_rates),
        sweep_seconds,
    )


@bench_app.command("shards")
def bench_shards(
    primaries: Annotated[int, typer.Option(help="simulate 1 .. this many primaries")] = 3,
    scale: Annotated[int, typer.Option(help="fairness workload: 1 is 22,560 tasks")] = 1,
    tasks: Annotated[int, typer.Option(help="throughput: tasks preloaded")] = 60_000,
    tenants: Annotated[int, typer.Option(help="throughput: tenants")] = 300,
    claimers: Annotated[int, typer.Option(help="throughput: claiming processes")] = 4,
    as_json: AsJson = False,
) -> None:
    """Tenants spread over 1, 2 and 3 throwaway PostgreSQL instances: the fairness
    bound kept by each way of choosing a shard, quiet tenants' waits, throughput."""
    from rota.core.migrate import migrate as run_migrations
    from rota_tools.bench.shards import bench_shards as run
    from rota_tools.devservers import local_postgres

    if not 1 <= primaries <= 8:
        raise typer.BadParameter("from 1 to 8", param_hint="--primaries")
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(local_postgres()).url for _ in range(primaries)]
        for url in urls:
            with psycopg.connect(url, autocommit=True) as conn:
                run_migrations(conn)
        _report("shards", run(urls, scale * 250, tasks, tenants, claimers), as_json)


@_scenario("lock-pressure", redis=False)
def bench_lock_pressure(
    settings: Settings,
    tenants: int = 1000,
    connections: int = 8,
    claim_size: int = 100,
    seconds: float = 5.0,
) -> dict[str, Any]:
    """Racing claimers (some tenants limited) while pg_locks is sampled."""
    from rota_tools.bench.claim import lock_pressure

    return lock_pressure(settings.database_url, tenants, connections, claim_size, seconds)


@_scenario("backlog-scaling", redis=False)
def bench_backlog_scaling(
    settings: Settings,
    backlogs: str = "10000,100000,1000000",
    tenants: int = 1000,
    connections: int = 4,
    claim_size: int = 100,
    samples: int = 200,
) -> dict[str, Any]:
    """Claim latency at 10k, 100k and 1M waiting, and after as many were churned."""
    from rota_tools.bench.claim import backlog_scaling

    sizes = [int(b) for b in backlogs.split(",")]
    return backlog_scaling(settings.database_url, sizes, tenants, connections, claim_size, samples)


# As in `rota worker` (and the claimers' processes, rota's and FIFO's).
@_scenario("claim", redis=False, statements=True, gc=True)
def bench_claim(
    settings: Settings,
    backlogs: str = "10000,100000,1000000",
    tenants: int = 1000,
    connections: int = 4,
    claim_size: int = 100,
    samples: int = 200,
    seconds: float = 5.0,
    runs: int = 3,
    priorities: Annotated[
        str, typer.Option(help="the tasks' priorities in turn, e.g. 0,0,0,5,9 (mixed)")
    ] = "0",
) -> dict[str, Any]:
    """Claim + complete throughput (vs a plain FIFO baseline), and claim latency
    by backlog and after churn."""
    from rota_tools.bench.claim import bench_claim as run

    sizes = [int(b) for b in backlogs.split(",")]
    levels = [int(p) for p in priorities.split(",")]
    url = settings.database_url
    return run(url, sizes, tenants, connections, claim_size, samples, seconds, runs, levels)


@_scenario("console", gc=True)
def bench_console(
    settings: Settings,
    tasks: Annotated[int, typer.Option(help="tasks waiting")] = 1_000_000,
    tenants: Annotated[int, typer.Option(help="tenants they belong to")] = 10_000,
    connections: Annotated[int, typer.Option(help="claiming processes")] = 4,
    seconds: Annotated[float, typer.Option(help="each claim run, cut into windows")] = 16.0,
    runs: Annotated[int, typer.Option(help="claim runs, each from a full backlog")] = 12,
    window: Annotated[float, typer.Option(help="seconds with, then without, a console")] = 4.0,
) -> dict[str, Any]:
    """The console over a big queue: each page's and API read's time, and
    claim + complete with a console refreshing every 2 s against without."""
    from rota_tools.bench.console import bench_console as run

    return run(settings, tasks, tenants, connections, seconds, runs, window)


@bench_app.command("chaos")
def bench_chaos(
    rate: Annotated[float, typer.Option(help="tasks per second offered")] = 150.0,
    baseline_seconds: float = 30.0,
    settle_seconds: Annotated[
        float, typer.Option(help="under load after each fault, at most (until throughput is back)")
    ] = 20.0,
    pg_pause_seconds: Annotated[float, typer.Option(help="PostgreSQL down this long")] = 10.0,
    spark: Annotated[
        bool, typer.Option("--spark/--no-spark", help="kill -9 a Spark loader too")
    ] = True,
    faults: Annotated[
        bool, typer.Option("--faults/--no-faults", help="off: the same run, no faults")
    ] = True,
    network: Annotated[
        bool,
        typer.Option(
            "--network",
            help="network faults instead: each process in a namespace of its own, its links "
            "cut silently, half-open and slow (root)",
        ),
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Faults under load (kill -9 of each process, Redis and PostgreSQL
    restarts; or with --network, silent partitions, half-open and slow
    links): acknowledged vs ran, duplicates by cause, limit violations,
    detection and recovery times, throughput held. Throwaway servers."""
    from rota_tools.bench.chaos import run_chaos

    if network:
        from rota_tools.bench.network import run_network_chaos

        figures = run_network_chaos(
            rate=rate, baseline_seconds=baseline_seconds, settle_seconds=settle_seconds
        )
        _report("chaos-network", figures, as_json)
        return

    figures = run_chaos(
        rate=rate,
        baseline_seconds=baseline_seconds,
        settle_seconds=settle_seconds,
        pg_pause_seconds=pg_pause_seconds,
        spark=spark,
        faults_enabled=faults,
    )
    _report("chaos", figures, as_json)


@bench_app.command("compare")
def bench_compare(
    baseline: Annotated[str, typer.Option(help="the commit to compare against (any git revision)")],
    candidate: Annotated[
        str | None,
        typer.Option(help="a commit to compare instead of the working tree"),
    ] = None,
    stages: Annotated[
        str, typer.Option(help="comma-separated, of: " + ", ".join(STAGES))
    ] = ",".join(DEFAULT_STAGES),
    rounds: Annotated[int, typer.Option(help="runs of each side per stage, alternating")] = 3,
    set_args: Annotated[
        list[str] | None,
        typer.Option("--set", help="STAGE=ARGS: extra arguments for a stage's runs"),
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds one run may take")] = 1200.0,
    keep: Annotated[bool, typer.Option(help="keep the baseline's worktree")] = False,
    database_url: Annotated[
        str | None,
        typer.Option(help="a PostgreSQL URL whose role may create databases (default: throwaway)"),
    ] = None,
    redis_url: Annotated[
        str | None, typer.Option(help="a Redis URL it may flush (default: throwaway)")
    ] = None,
    out: Annotated[str | None, typer.Option(help="also write the JSON report here")] = None,
    as_json: AsJson = False,
) -> None:
    """A/B: the baseline commit against the working tree (or --candidate),
    alternating on the same servers; one table per stage with medians,
    spreads, change, and whether the change is outside the spread."""
    from rota_tools.bench import compare as ab
    from rota_tools.devservers import local_postgres, local_redis

    try:
        chosen = ab.parse_stages(stages)
        extra = ab.parse_extra_args(set_args or [])
        if rounds < 1:
            raise ab.CompareError("--rounds must be at least 1")
        repo = ab.repository_root()
    except ab.CompareError as exc:
        raise typer.BadParameter(str(exc)) from None
    if (database_url is None) != (redis_url is None):
        raise typer.BadParameter("give both --database-url and --redis-url, or neither")

    def log(line: str) -> None:
        typer.echo(line, err=True)

    with contextlib.ExitStack() as stack:
        base = stack.enter_context(ab.checkout(repo, baseline, "baseline", keep))
        if candidate is None:
            commit, label = ab.snapshot(repo)
            new = stack.enter_context(ab.checkout(repo, commit, "candidate", keep, label))
        else:
            new = stack.enter_context(ab.checkout(repo, candidate, "candidate", keep))
        if database_url is None or redis_url is None:
            database_url = stack.enter_context(local_postgres(BENCH_POSTGRES)).url
            redis_url = stack.enter_context(local_redis()).url
        log(f"baseline {base.revision[:10]} ({base.tree}); candidate {new.revision} ({new.tree})")
        results = ab.compare(
            (base, new), chosen, rounds, database_url, redis_url, extra, timeout, log
        )
    names = (f"baseline {base.revision[:7]}", new.revision[:7] if candidate else "working tree")
    figures = {
        "baseline": base.revision,
        "candidate": new.revision,
        "rounds": rounds,
        "stages": results,
    }
    if out:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(stamped("compare", figures), handle, indent=2)
    if as_json:
        _report("compare", figures, as_json)
        return
    for stage in chosen:
        stage_report = results[stage]
        typer.echo(ab.stage_table(stage, ab.STAGES[stage].metrics, stage_report["figures"], names))
        for side, failures in stage_report["failures"].items():
            typer.echo(f"  {side}: {len(failures)} failed run(s): {failures[-1]}")
        typer.echo("")


@_scenario("cancel")
def bench_cancel_command(
    settings: Settings,
    runs: Annotated[int, typer.Option(help="cancels of each kind of task")] = 30,
) -> dict[str, Any]:
    """Cancel of a running task to its row ending `cancelled`: a sync task
    (cooperative) and an async one, p50 and p99."""
    from rota_tools.bench.cancel import bench_cancel

    return bench_cancel(settings, runs)


@bench_app.command("report")
def bench_report(
    runs: Annotated[str, typer.Option(help="the folder of runs' JSON reports")] = "bench-runs",
    run: Annotated[bool, typer.Option(help="run the stages first, into --runs")] = False,
    stages: Annotated[
        str, typer.Option(help="with --run: comma-separated, of: " + ", ".join(STAGES))
    ] = ",".join(STAGES),
    rounds: Annotated[int, typer.Option(help="with --run: runs of each stage")] = 3,
    page: Annotated[
        str, typer.Option(help="the page whose generated part is rewritten")
    ] = "docs/explanation/benchmarks.md",
    timeout: Annotated[float, typer.Option(help="seconds one run may take")] = 1200.0,
) -> None:
    """The benchmarks page's figures from one set of runs: each stage's
    figures (medians and ranges, ratios to the same run's baselines), the
    machine and the dates once; and, when the folder holds a comparison
    (`rota bench compare --out RUNS/before-after.json`), each process's CPU
    per task before and after. `--run` makes the runs first."""
    from rota_tools.bench import compare as ab
    from rota_tools.bench import report
    from rota_tools.devservers import local_postgres, local_redis

    folder = Path(runs)
    if run:
        try:
            chosen = ab.parse_stages(stages)
        except ab.CompareError as exc:
            raise typer.BadParameter(str(exc)) from None
        if rounds < 1:
            raise typer.BadParameter("--rounds must be at least 1")
        with local_postgres(BENCH_POSTGRES) as pg, local_redis() as rd:
            report.run_stages(
                ab.repository_root(),
                chosen,
                rounds,
                folder,
                pg.url,
                rd.url,
                timeout,
                lambda line: typer.echo(line, err=True),
            )
    try:
        generated = report.render(report.load_runs(folder), report.load_comparison(folder))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    report.write_page(Path(page), generated)
    typer.echo(f"wrote {page} from {folder}")


def demo(
    flood: int = 100_000,
    small_tenants: int = 50,
    out: Annotated[str, typer.Option(help="where the chart goes")] = "demo-out",
    loader: Annotated[
        str, typer.Option(help="spark, python, or auto: Spark where there is Java")
    ] = "auto",
    as_json: AsJson = False,
) -> None:
    """The whole pipeline: a flood, quiet tenants, fair waits. On the servers
    of ROTA_DATABASE_URL / ROTA_REDIS_URL, or the embedded ones when no URL is
    set."""
    tune_gc()
    from rota_tools.demo import main as run_demo

    result = run_demo(flood=flood, small_tenants=small_tenants, out=out, loader=loader)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
