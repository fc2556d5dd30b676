"""The `rota` command."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated, Any

import psycopg
import typer

from rota.process import on_stop_signals, tune_gc
from rota.settings import Settings

app = typer.Typer(
    help="rota: a fair, multi-tenant task queue.",
    no_args_is_help=True,
    # Locals may hold URLs with passwords: never shown.
    pretty_exceptions_show_locals=False,
)
bench_app = typer.Typer(help="Benchmarks; JSON figures with their baselines.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
loader_app = typer.Typer(help="Drain the Redis buffer into PostgreSQL.", no_args_is_help=True)
app.add_typer(loader_app, name="loader")

DatabaseUrl = Annotated[
    str | None, typer.Option(help="PostgreSQL URL (default: ROTA_DATABASE_URL)")
]


_debug = False


@app.callback()
def _options(
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks of errors")] = False,
) -> None:
    global _debug
    _debug = debug


def _settings(database_url: str | None = None, redis_url: str | None = None) -> Settings:
    overrides: dict[str, Any] = {}
    if database_url:
        overrides["database_url"] = database_url
    if redis_url:
        overrides["redis_url"] = redis_url
    return Settings(**overrides)


@app.command()
def migrate(
    roles: Annotated[
        bool, typer.Option(help="create rota_owner/_producer/_loader/_worker/_admin and grants")
    ] = False,
    print_roles: Annotated[
        bool, typer.Option(help="print the roles' SQL instead of running anything")
    ] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Create or upgrade rota's schema (idempotent; concurrent runs take turns)."""
    from rota.migrate import migrate as run_migrations
    from rota.migrate import roles_script

    if print_roles:
        typer.echo(roles_script(), nl=False)
        return
    with psycopg.connect(_settings(database_url).database_url, autocommit=True) as conn:
        applied = run_migrations(conn, roles=roles)
    typer.echo(f"applied migrations: {applied}" if applied else "schema is up to date")
    if roles:
        typer.echo("roles rota_owner, rota_producer, rota_loader, rota_worker, rota_admin ready")


RedisUrl = Annotated[str | None, typer.Option(help="Redis URL (default: ROTA_REDIS_URL)")]


@loader_app.command("drain")
def loader_drain(
    max_seconds: Annotated[float | None, typer.Option(help="stop after this long")] = None,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
) -> None:
    """One pass until the buffer is empty (or --max-seconds): a JSON summary, and
    exit code 0 when drained, 2 when stopped with work left, 1 on failure."""
    tune_gc()
    import dataclasses

    from rota.loader import Loader

    loader = Loader(_settings(database_url, redis_url))
    try:
        summary = loader.drain(max_seconds=max_seconds)
    finally:
        loader.close()
    typer.echo(json.dumps({**dataclasses.asdict(summary), "exit_code": summary.exit_code}))
    raise typer.Exit(summary.exit_code)


@loader_app.command("run")
def loader_run(
    engine: Annotated[str, typer.Option(help="spark (default) or python")] = "spark",
    master: Annotated[str, typer.Option(help="Spark master URL")] = "local[*]",
    checkpoint: Annotated[str, typer.Option(help="Spark checkpoint directory")] = (
        "./rota-checkpoints/loader"
    ),
    trigger_seconds: Annotated[float, typer.Option(help="Spark micro-batch interval")] = 0.5,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
) -> None:
    """Long-running loader; SIGTERM or Ctrl-C stops it after the batch in hand."""
    tune_gc()
    import threading

    settings = _settings(database_url, redis_url)
    stop = threading.Event()
    if engine == "python":
        from rota.loader import Loader

        on_stop_signals(stop.set)
        loader = Loader(settings)
        try:
            summary = loader.run_forever(stop.is_set)
        finally:
            loader.close()
        typer.echo(
            json.dumps(
                {
                    "loaded": summary.loaded,
                    "entries": summary.entries,
                    "dead_lettered": summary.dead_lettered,
                }
            )
        )
    elif engine == "spark":
        from rota.loader.spark import run_streaming, spark_session

        # The session first: its SparkContext puts a handler on SIGINT that
        # cancels the batch in hand; rota's then takes its place.
        session = spark_session(master)
        on_stop_signals(stop.set)
        try:
            run_streaming(
                settings,
                checkpoint=checkpoint,
                trigger_seconds=trigger_seconds,
                should_stop=stop.is_set,
                session=session,
            )
        finally:
            session.stop()
    else:
        raise typer.BadParameter(f"unknown engine {engine!r}: use spark or python")


def load_app(spec: str) -> Any:
    """`package.module:attribute` -> the rota.App it names."""
    import importlib

    from rota.producer.app import App

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise typer.BadParameter(f"--app must look like package.module:app, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        application = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise typer.BadParameter(f"cannot load the app {spec!r}: {exc}") from None
    if not isinstance(application, App):
        raise typer.BadParameter(f"{spec} is a {type(application).__name__}, not a rota.App")
    return application


def _split(names: str | None) -> list[str]:
    return [n.strip() for n in (names or "").split(",") if n.strip()]


@app.command()
def worker(
    app_spec: Annotated[str, typer.Option("--app", help="package.module:app")],
    queues: Annotated[
        str | None, typer.Option(help="comma-separated (default: its app's tasks' queues)")
    ] = None,
    exclude: Annotated[str | None, typer.Option(help="queues to leave alone")] = None,
    concurrency: int = 4,
    batch_size: int = 10,
    maintenance: Annotated[bool, typer.Option(help="take part in reaper/scheduler duty")] = True,
) -> None:
    """Run tasks. SIGTERM/SIGINT: stop claiming, hand back unstarted tasks, let
    running ones finish within ROTA_SHUTDOWN_GRACE_SECONDS."""
    tune_gc()
    from rota.consumer import Worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    runner = Worker(
        load_app(app_spec),
        queues=_split(queues) or None,
        exclude=_split(exclude),
        concurrency=concurrency,
        batch_size=batch_size,
        maintenance=maintenance,
    )
    on_stop_signals(runner.stop)
    if not runner.run():
        # Tasks outlived the shutdown grace and were handed back; their
        # threads cannot be stopped, and would keep the process alive.
        logging.shutdown()
        os._exit(0)


@app.command()
def reaper(
    app_spec: Annotated[str | None, typer.Option("--app", help="for cron schedules")] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """The maintenance sidecar: promotes due tasks, requeues expired leases and
    dead workers' tasks, fires cron ticks. Several may run; one is active."""
    import threading

    from rota.consumer import Maintenance
    from rota.consumer.maintenance import run_maintenance

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    application = load_app(app_spec) if app_spec else None
    settings = application.settings if application else _settings(database_url)
    stop = threading.Event()
    on_stop_signals(stop.set)
    run_maintenance(settings, Maintenance(settings, application), stop)


@app.command("import")
def import_command(
    path: Annotated[str, typer.Argument(help="a Parquet, CSV or JSON-lines file or folder")],
    file_format: Annotated[str | None, typer.Option("--format", help="parquet|csv|json")] = None,
    rejected: Annotated[str | None, typer.Option(help="where to write rejected rows")] = None,
    master: Annotated[str, typer.Option(help="Spark master URL")] = "local[*]",
    database_url: DatabaseUrl = None,
) -> None:
    """Load a file of tasks with fair sequencing (Spark batch job); rejected rows
    are written with their reasons. Exit code 0 if all rows loaded, 2 if some
    were rejected."""
    tune_gc()
    from rota.loader.importer import import_tasks, summary_dict

    summary = import_tasks(
        _settings(database_url),
        path,
        file_format=file_format,
        rejected_path=rejected,
        master=master,
    )
    typer.echo(json.dumps(summary_dict(summary), indent=2))
    raise typer.Exit(2 if summary.rejected else 0)


@app.command()
def tenant(
    name: Annotated[str, typer.Argument(help="the tenant's name")],
    weight: Annotated[float, typer.Option(help="share of turns relative to others")] = 1.0,
    concurrency_limit: Annotated[int | None, typer.Option(help="max running fleet-wide")] = None,
    rate_limit: Annotated[float | None, typer.Option(help="tasks per second")] = None,
    rate_burst: Annotated[float | None, typer.Option(help="token bucket size")] = None,
    capacity: Annotated[int | None, typer.Option(help="max waiting work (cost units)")] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Create or change a tenant (options not given are cleared)."""
    from rota import db, ops

    # Checked here, before connecting: bad input is told as such.
    configure = ops.configure_tenant(
        name,
        weight=weight,
        concurrency_limit=concurrency_limit,
        rate_limit=rate_limit,
        rate_burst=rate_burst,
        capacity=capacity,
    )
    with db.connect(_settings(database_url).database_url) as conn:
        slot = db.transact(conn, configure)
    typer.echo(
        json.dumps(
            {
                "tenant": name,
                "slot": slot,
                "weight": weight,
                "concurrency_limit": concurrency_limit,
                "rate_limit": rate_limit,
                "rate_burst": rate_burst,
                "capacity": capacity,
            }
        )
    )


@app.command()
def stats(
    output: Annotated[str, typer.Option("--format", help="json or prometheus")] = "json",
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
) -> None:
    """Buffer depth and oldest entry per shard, and the queues' counts."""
    from rota import db, ops
    from rota.loader import Loader
    from rota.metrics import prometheus_text

    settings = _settings(database_url, redis_url)
    loader = Loader(settings)
    try:
        buffer = loader.buffer_stats()
    finally:
        loader.close()
    with db.connect(settings.database_url) as conn:
        queues = db.run(conn, ops.queue_counts())
    if output == "prometheus":
        typer.echo(prometheus_text(buffer, queues), nl=False)
    else:
        typer.echo(json.dumps({"buffer": buffer, "queues": queues}, indent=2))


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _report(scenario: str, figures: dict[str, Any], as_json: bool) -> None:
    report = {
        "scenario": scenario,
        "at": datetime.now(UTC).isoformat(),
        "machine": _machine(),
        **figures,
    }
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


@contextlib.contextmanager
def _bench_settings(
    database_url: str | None, redis_url: str | None, local: bool | None
) -> Iterator[Settings]:
    """Settings for a benchmark, schema migrated: the given servers, or
    throwaway local ones."""
    from rota.devservers import local_postgres, local_redis
    from rota.migrate import migrate as run_migrations

    configured = database_url or "ROTA_DATABASE_URL" in os.environ
    with contextlib.ExitStack() as stack:
        if local if local is not None else not configured:
            pg = stack.enter_context(local_postgres())
            rd = stack.enter_context(local_redis())
            settings = _settings(pg.url, rd.url)
        else:
            settings = _settings(database_url, redis_url)
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            run_migrations(conn)
        yield settings


@bench_app.command("load")
def bench_load(
    engine: Annotated[str, typer.Option(help="core (bulk SQL vs raw COPY), python or spark")] = (
        "core"
    ),
    tasks: int = 200_000,
    loaders: Annotated[int, typer.Option(help="python engine: loader processes")] = 2,
    tenants: int = 1000,
    runs: int = 3,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    local: Local = None,
    as_json: AsJson = False,
) -> None:
    """Loading: the core's fair bulk load vs raw COPY (--engine core), or the
    buffer -> PostgreSQL pipeline's tasks/s and enqueue -> claimable latency."""
    from rota.bench.core import bench_load as run_core
    from rota.bench.pipeline import bench_pipeline_load

    tune_gc()  # as in `rota loader` (and its Python loaders' processes)
    with _bench_settings(database_url, redis_url, local) as settings:
        if engine == "core":
            figures = run_core(settings.database_url, tasks, tenants, runs)
        elif engine in ("python", "spark"):
            figures = bench_pipeline_load(settings, engine, tasks, tenants, runs, loaders)
        else:
            raise typer.BadParameter(f"unknown engine {engine!r}")
        _report("load", figures, as_json)


@bench_app.command("enqueue")
def bench_enqueue(
    tasks: int = 200_000,
    tenants: int = 1000,
    runs: int = 3,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    local: Local = None,
    as_json: AsJson = False,
) -> None:
    """Producer: enqueue_many and single enqueue into the buffer, and the fallback."""
    from rota.bench.pipeline import bench_enqueue as run

    with _bench_settings(database_url, redis_url, local) as settings:
        _report("enqueue", run(settings, tasks, tenants, runs), as_json)


@bench_app.command("work")
def bench_work(
    tasks: int = 50_000,
    tenants: int = 1000,
    concurrency: int = 8,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    local: Local = None,
    as_json: AsJson = False,
) -> None:
    """No-op tasks through the worker runtime: tasks/s with 1 and 2 processes,
    and enqueue -> start latency with NOTIFY."""
    from rota.bench.pipeline import bench_work as run

    with _bench_settings(database_url, redis_url, local) as settings:
        _report("work", run(settings, tasks, tenants, concurrency), as_json)


def _fairness_command(scenario: str) -> None:
    def command(
        scale: Annotated[int, typer.Option(help="workload size multiplier")] = 100,
        database_url: DatabaseUrl = None,
        local: Local = None,
        as_json: AsJson = False,
    ) -> None:
        from rota.bench.fairness import bench_fairness

        with _bench_settings(database_url, None, local) as settings:
            _report(scenario, bench_fairness(settings.database_url, scenario, scale), as_json)

    command.__doc__ = f"Fairness: the {scenario} workload through rota, FIFO and PARTITION BY."
    bench_app.command(scenario)(command)


for _scenario in ("noisy-neighbour", "zipf", "weighted", "cost"):
    _fairness_command(_scenario)


@bench_app.command("end-to-end")
def bench_end_to_end(
    tasks: int = 20_000,
    tenants: int = 100,
    rate: float = 2000.0,
    concurrency: int = 8,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    local: Local = None,
    as_json: AsJson = False,
) -> None:
    """Producer -> Redis -> Python loader -> 2 workers at a steady offered rate."""
    from rota.bench.pipeline import bench_end_to_end as run

    with _bench_settings(database_url, redis_url, local) as settings:
        _report("end-to-end", run(settings, tasks, tenants, rate, concurrency), as_json)


@bench_app.command("lock-pressure")
def bench_lock_pressure(
    tenants: int = 1000,
    connections: int = 8,
    claim_size: int = 100,
    seconds: float = 5.0,
    database_url: DatabaseUrl = None,
    local: Local = None,
    as_json: AsJson = False,
) -> None:
    """Racing claimers (some tenants limited) while pg_locks is sampled."""
    from rota.bench.core import lock_pressure

    with _bench_settings(database_url, None, local) as settings:
        _report(
            "lock-pressure",
            lock_pressure(settings.database_url, tenants, connections, claim_size, seconds),
            as_json,
        )


@bench_app.command("backlog-scaling")
def bench_backlog_scaling(
    backlogs: str = "10000,100000,1000000",
    tenants: int = 1000,
    connections: int = 4,
    claim_size: int = 100,
    samples: int = 200,
    database_url: DatabaseUrl = None,
    local: Local = None,
    as_json: AsJson = False,
) -> None:
    """Claim latency at 10k, 100k and 1M waiting, and after as many were churned."""
    from rota.bench.core import backlog_scaling

    sizes = [int(b) for b in backlogs.split(",")]
    with _bench_settings(database_url, None, local) as settings:
        figures = backlog_scaling(
            settings.database_url, sizes, tenants, connections, claim_size, samples
        )
        _report("backlog-scaling", figures, as_json)


@bench_app.command("claim")
def bench_claim(
    backlogs: str = "10000,100000,1000000",
    tenants: int = 1000,
    connections: int = 4,
    claim_size: int = 100,
    samples: int = 200,
    seconds: float = 5.0,
    runs: int = 3,
    database_url: DatabaseUrl = None,
    local: Local = None,
    as_json: AsJson = False,
) -> None:
    """Claim + complete throughput (vs a plain FIFO baseline), and claim latency
    by backlog and after churn."""
    from rota.bench.core import bench_claim as run

    tune_gc()  # as in `rota worker` (and the claimers' processes, rota's and FIFO's)
    sizes = [int(b) for b in backlogs.split(",")]
    with _bench_settings(database_url, None, local) as settings:
        figures = run(
            settings.database_url, sizes, tenants, connections, claim_size, samples, seconds, runs
        )
        _report("claim", figures, as_json)


@bench_app.command("chaos")
def bench_chaos(
    rate: Annotated[float, typer.Option(help="tasks per second offered")] = 150.0,
    baseline_seconds: float = 30.0,
    settle_seconds: Annotated[float, typer.Option(help="under load after each fault")] = 20.0,
    pg_pause_seconds: Annotated[float, typer.Option(help="PostgreSQL down this long")] = 10.0,
    spark: Annotated[
        bool, typer.Option("--spark/--no-spark", help="kill -9 a Spark loader too")
    ] = True,
    faults: Annotated[
        bool, typer.Option("--faults/--no-faults", help="off: the same run, no faults")
    ] = True,
    as_json: AsJson = False,
) -> None:
    """Faults under load (kill -9 of each process, Redis and PostgreSQL
    restarts): acknowledged vs ran, duplicates by cause, limit violations,
    recovery times, throughput held. Throwaway servers."""
    from rota.bench.chaos import run_chaos

    figures = run_chaos(
        rate=rate,
        baseline_seconds=baseline_seconds,
        settle_seconds=settle_seconds,
        pg_pause_seconds=pg_pause_seconds,
        spark=spark,
        faults_enabled=faults,
    )
    _report("chaos", figures, as_json)


@app.command()
def demo(
    flood: int = 100_000,
    small_tenants: int = 50,
    out: Annotated[str, typer.Option(help="where the chart goes")] = "demo-out",
    as_json: AsJson = False,
) -> None:
    """The whole pipeline on local servers: a flood, quiet tenants, fair waits."""
    tune_gc()
    from rota.demo import main as run_demo

    result = run_demo(flood=flood, small_tenants=small_tenants, out=out)
    if as_json:
        typer.echo(json.dumps(result, indent=2))


def main() -> None:
    from rota.cli_errors import explain

    try:
        app()
    except Exception as exc:
        if _debug:
            raise
        line, code = explain(exc)
        typer.echo(f"rota: {line}", err=True)
        raise SystemExit(code) from None


if __name__ == "__main__":
    main()
