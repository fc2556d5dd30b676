"""`rota worker` and `rota maintenance`: running tasks, and the maintenance duties."""

from __future__ import annotations

import enum
from typing import Annotated

import typer

from rota.cli.app import (
    DatabaseUrl,
    LogFormat,
    LogLevel,
    MetricsHost,
    MetricsPort,
    app,
    load_app,
    settings_from,
    split_names,
)
from rota.runtime.process import on_stop_signals


class Pool(enum.StrEnum):
    threads = "threads"
    processes = "processes"


@app.command()
def worker(
    app_spec: Annotated[str, typer.Option("--app", help="package.module:app")],
    queues: Annotated[
        str | None, typer.Option(help="comma-separated (default: its app's tasks' queues)")
    ] = None,
    exclude: Annotated[str | None, typer.Option(help="queues to leave alone")] = None,
    concurrency: int = 4,
    batch_size: int = 10,
    pool: Annotated[
        Pool,
        typer.Option(help="threads, or processes: sync tasks in child processes, one per slot"),
    ] = Pool.threads,
    maintenance: Annotated[bool, typer.Option(help="take part in the maintenance duties")] = True,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = "127.0.0.1",
    log_level: LogLevel = "info",
    log_format: LogFormat = "text",
) -> None:
    """Run tasks. SIGTERM/SIGINT: stop claiming, hand back unstarted tasks, let
    running ones finish within ROTA_SHUTDOWN_GRACE_SECONDS."""
    from rota.consumer.main import serve_worker

    serve_worker(
        load_app(app_spec),
        app_spec,
        queues=split_names(queues),
        exclude=split_names(exclude),
        concurrency=concurrency,
        batch_size=batch_size,
        pool=pool.value,
        maintenance=maintenance,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        log_level=log_level,
        log_format=log_format,
    )


@app.command()
def maintenance(
    app_spec: Annotated[str | None, typer.Option("--app", help="for cron schedules")] = None,
    database_url: DatabaseUrl = None,
    log_level: LogLevel = "info",
    log_format: LogFormat = "text",
) -> None:
    """The maintenance sidecar: promotes due tasks, requeues expired leases and
    dead workers' tasks, fires cron ticks. Several may run; one is active."""
    import threading

    from rota.consumer import Maintenance
    from rota.consumer.maintenance import run_maintenance
    from rota.runtime import logs

    logs.configure(log_level, log_format)
    application = load_app(app_spec) if app_spec else None
    settings = application.settings if application else settings_from(database_url)
    stop = threading.Event()
    on_stop_signals(stop.set)
    run_maintenance(settings, Maintenance(settings, application), stop)


@app.command(hidden=True)
def reaper(
    app_spec: Annotated[str | None, typer.Option("--app", help="for cron schedules")] = None,
    database_url: DatabaseUrl = None,
    log_level: LogLevel = "info",
    log_format: LogFormat = "text",
) -> None:
    """Deprecated: `rota maintenance`."""
    typer.echo("rota reaper is deprecated: run `rota maintenance`", err=True)
    maintenance(app_spec, database_url, log_level, log_format)
