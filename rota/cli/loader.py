"""`rota loader` and `rota import`: tasks into PostgreSQL."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from rota.cli.app import (
    DatabaseUrl,
    LogFormat,
    LogLevel,
    MetricsHost,
    MetricsPort,
    RedisUrl,
    app,
    settings_from,
)
from rota.cli.output import AsJson, Progress
from rota.runtime.process import on_stop_signals, tune_gc

SparkConf = Annotated[
    list[str] | None,
    typer.Option("--conf", help="a Spark setting, key=value (repeatable)"),
]
SparkUI = Annotated[bool, typer.Option("--spark-ui", help="serve Spark's web UI")]
SparkLogLevel = Annotated[
    str | None,
    typer.Option(
        "--spark-log-level",
        help="show Spark's and the JVM's own log at this level (warn, info, ...); "
        "by default it goes to a file",
    ),
]


def spark_options(conf: list[str] | None, ui: bool, log_level: str | None) -> Any:
    from rota.loader.spark_session import LOG_LEVELS, SparkOptions, parse_conf

    try:
        pairs = parse_conf(conf)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if log_level is not None and log_level.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"--spark-log-level takes one of {', '.join(LOG_LEVELS)}")
    return SparkOptions(pairs, ui, log_level)


loader_app = typer.Typer(
    rich_markup_mode=None,
    help="Drain the Redis buffer into PostgreSQL.",
    no_args_is_help=True,
)
app.add_typer(loader_app, name="loader")


@loader_app.command("drain")
def loader_drain(
    max_seconds: Annotated[float | None, typer.Option(help="stop after this long")] = None,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    as_json: AsJson = False,
) -> None:
    """One pass until the buffer is empty (or --max-seconds): a JSON summary, and
    exit code 0 when drained, 2 when stopped with work left (or entries other
    loaders read and have not loaded), 1 on failure (entries it read and could
    not load are handed back for the next drain at once).
    Progress (entries read of those buffered at the start, tasks loaded) goes
    to stderr: a bar on a terminal, JSON lines with --json."""
    tune_gc()
    import dataclasses

    from rota.loader import Loader
    from rota.loader.engine import LOADER_OUTAGES, DrainSummary

    loader = Loader(settings_from(database_url, redis_url))
    try:
        try:
            buffered: int | None = sum(
                int(shard["entries"]) for shard in loader.buffer_stats().values()
            )
        except LOADER_OUTAGES:
            buffered = None  # the drain waits the outage out or reports it
        progress = Progress("draining the buffer", as_json, total=buffered)

        def passed(so_far: DrainSummary) -> None:
            progress.show(
                so_far.entries,
                loaded=so_far.loaded,
                duplicates=so_far.duplicates,
                dead_lettered=so_far.dead_lettered,
            )

        try:
            summary = loader.drain(max_seconds=max_seconds, on_pass=passed)
        finally:
            progress.close()
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
    trigger_seconds: Annotated[float, typer.Option(help="Spark micro-batch interval")] = 0.1,
    conf: SparkConf = None,
    spark_ui: SparkUI = False,
    spark_log_level: SparkLogLevel = None,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = "127.0.0.1",
    log_level: LogLevel = "info",
    log_format: LogFormat = "text",
) -> None:
    """Long-running loader; SIGTERM or Ctrl-C stops it after the batch in hand."""
    tune_gc()
    import threading

    from rota.readmodel.health import serve_health
    from rota.readmodel.metrics import LoaderMetrics
    from rota.runtime import logs

    logs.configure(log_level, log_format)
    settings = settings_from(database_url, redis_url)
    stop = threading.Event()
    metrics = LoaderMetrics()
    if metrics_port is not None:
        serve_health(settings, metrics_host, metrics_port, metrics.ready, metrics.registry)
    if engine == "python":
        from rota.loader import Loader

        on_stop_signals(stop.set)
        loader = Loader(settings, metrics=metrics)
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
        session = spark_session(master, options=spark_options(conf, spark_ui, spark_log_level))
        on_stop_signals(stop.set)
        try:
            run_streaming(
                settings,
                checkpoint=checkpoint,
                trigger_seconds=trigger_seconds,
                should_stop=stop.is_set,
                session=session,
                metrics=metrics,
            )
        finally:
            session.stop()
    else:
        raise typer.BadParameter(f"unknown engine {engine!r}: use spark or python")


@app.command("import")
def import_command(
    path: Annotated[str, typer.Argument(help="a Parquet, CSV or JSON-lines file or folder")],
    file_format: Annotated[str | None, typer.Option("--format", help="parquet|csv|json")] = None,
    rejected: Annotated[
        str | None,
        typer.Option(
            help="where to write rejected rows: any URI Spark can write (<PATH>.rejected)"
        ),
    ] = None,
    master: Annotated[str, typer.Option(help="Spark master URL")] = "local[*]",
    conf: SparkConf = None,
    spark_ui: SparkUI = False,
    spark_log_level: SparkLogLevel = None,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Load a file of tasks with fair sequencing (Spark batch job: the executors
    validate and load their parts); rejected rows are written with their
    reasons. Importing the same file again loads nothing new. Exit code 0 if
    all rows loaded, 2 if some were rejected. Progress (rows read, tasks
    loaded, rows rejected; time left for Parquet, whose rows are counted from
    its footers) goes to stderr: a bar on a terminal, JSON lines with --json."""
    tune_gc()
    from rota.loader.importer import import_tasks, summary_dict

    progress = Progress("importing rows", as_json)

    def read(rows: int, loaded: int, rejected: int, total: int | None) -> None:
        progress.total = total
        progress.show(rows, loaded=loaded, rejected=rejected)

    try:
        summary = import_tasks(
            settings_from(database_url),
            path,
            file_format=file_format,
            rejected_path=rejected,
            master=master,
            options=spark_options(conf, spark_ui, spark_log_level),
            on_progress=read,
        )
    finally:
        progress.close()
    typer.echo(json.dumps(summary_dict(summary), indent=2))
    raise typer.Exit(2 if summary.rejected else 0)


@app.command("archive")
def archive_command(
    before: Annotated[
        str,
        typer.Option(help="what ended before this day: YYYY-MM-DD, or a duration ago (30d)"),
    ],
    to: Annotated[
        str, typer.Option("--to", help="where: any URI Spark writes (Parquet by day and queue)")
    ],
    master: Annotated[str, typer.Option(help="Spark master URL")] = "local[*]",
    conf: SparkConf = None,
    spark_ui: SparkUI = False,
    spark_log_level: SparkLogLevel = None,
    database_url: DatabaseUrl = None,
    as_json: AsJson = False,
) -> None:
    """Write the tasks that succeeded, died or were cancelled before a day to
    Parquet, partitioned by day and queue (a Spark job), each once: a run
    takes the days since the previous one's bound. Progress (tasks read, hours
    of tasks read of those to read) goes to stderr: a bar on a terminal, JSON
    lines with --json."""
    from rota.cli.tasks import since_time
    from rota.loader.archive import archive, summary_dict

    when = since_time(before)
    assert when is not None
    progress = Progress("archiving tasks", as_json)

    def read(tasks: int, hours_read: int, hours: int) -> None:
        progress.show(tasks, fraction=hours_read / hours, hours_read=hours_read, hours=hours)

    try:
        summary = archive(
            settings_from(database_url),
            when,
            to,
            master=master,
            options=spark_options(conf, spark_ui, spark_log_level),
            on_progress=read,
        )
    finally:
        progress.close()
    typer.echo(json.dumps(summary_dict(summary), indent=2))
