"""Operators' commands about queues and figures: `rota queue`, `rota prune`
and `rota stats`."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from rota.cli.app import (
    DatabaseUrl,
    RedisUrl,
    add_pause_commands,
    app,
    run_admin,
    settings_from,
)
from rota.cli.errors import unavailable
from rota.cli.output import Actor, AsJson, Progress, actor_or_default, cell, emit, table
from rota.core.db import Op

queue_app = typer.Typer(
    rich_markup_mode=None, help="Queues: list, pause, resume, charge by time or cost."
)
app.add_typer(queue_app, name="queue", no_args_is_help=True)


@queue_app.command("list")
def queue_list(as_json: AsJson = False, database_url: DatabaseUrl = None) -> None:
    """Every queue with its figures (as of the last maintenance count)."""
    from rota.core import read

    rows = run_admin(database_url, read.queues())
    emit(rows, as_json, lambda: _queue_table(rows))


def _queue_table(queues: Any) -> str:
    """The queues and their figures, as `rota queue list` and `rota stats` print them."""
    return table(
        [
            "queue",
            "paused",
            "waiting",
            "running",
            "claimed, not started",
            "scheduled",
            "dead",
            "per min",
            "oldest wait s",
        ],
        [
            (
                q.name,
                "yes" if q.paused else "",
                q.waiting,
                q.running,
                q.prefetched,
                q.scheduled,
                q.dead,
                q.per_minute,
                q.oldest_wait_seconds,
            )
            for q in queues
        ],
    )


def _pause_queue(name: str, paused: bool, actor: str) -> Op[bool]:
    from rota import core

    return core.pause_queue(name, paused, actor)


add_pause_commands(queue_app, "queue", _pause_queue)


@queue_app.command("charge")
def queue_charge(
    name: str,
    by: Annotated[
        str,
        typer.Option(
            help="time: a tenant's task costs its measured seconds per run (equal weights, "
            "equal worker time); cost: its declared cost alone (the default)"
        ),
    ],
    actor: Actor = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """How a queue charges its tenants' turns: by measured run time or by declared cost."""
    from rota import core

    if by not in ("time", "cost"):
        raise typer.BadParameter(f"--by is time or cost, not {by!r}")
    found = run_admin(database_url, core.charge_queue(name, by == "time", actor_or_default(actor)))
    if not found:
        typer.echo(f"rota: no queue named {name!r}", err=True)
        raise typer.Exit(1)
    emit({"queue": name, "charge": by}, as_json, lambda: f"{name}: charged by {by}")


@app.command()
def prune(
    older_than: Annotated[str, typer.Option(help="e.g. 7d, 12h: finished and dead tasks older")],
    actor: Actor = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Delete records of succeeded tasks, and dead or cancelled tasks, that
    ended longer ago than --older-than (maintenance also does this, from
    ROTA_FINISHED_RETENTION and ROTA_DEAD_RETENTION)."""
    from rota import core
    from rota.core import connections, db
    from rota.model.rules import parse_duration

    seconds = parse_duration(older_than)
    pruned = {"finished": 0, "dead": 0}
    progress = Progress("pruning tasks", as_json)
    try:
        with connections.connect(settings_from(database_url), "admin") as conn:
            for kind, op in (("finished", core.prune_finished), ("dead", core.prune_dead)):
                while batch := db.run(conn, op(seconds)):
                    pruned[kind] += batch
                    progress.advance(batch, kind)
            detail = {"older_than_seconds": seconds, **pruned}
            total = pruned["finished"] + pruned["dead"]
            db.run(conn, core.record(actor_or_default(actor), "prune", "tasks", total, detail))
    finally:
        progress.close()
    emit(
        pruned,
        as_json,
        lambda: (
            f"pruned {pruned['finished']:,} finished and "
            f"{pruned['dead']:,} dead or cancelled task(s)"
        ),
    )


@app.command()
def stats(
    output: Annotated[str, typer.Option("--format", help="text, json or prometheus")] = "text",
    tenants: Annotated[int, typer.Option(help="the top tenants by waiting tasks")] = 10,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
) -> None:
    """Queues, top tenants, workers, the buffer and its dead letters. Prints
    what it can when one of the servers is down."""
    from rota.readmodel.figures import gather

    if output not in ("text", "json", "prometheus"):
        raise typer.BadParameter("--format takes text, json or prometheus")
    figures = gather(settings_from(database_url, redis_url), tenants)
    if output == "prometheus":
        from rota.readmodel.metrics import figures_text

        typer.echo(figures_text(figures), nl=False)
    else:
        emit(figures, as_json or output == "json", lambda: render_text(figures))


def render_text(f: Any) -> str:
    parts = [f"rota at {cell(f.at)}"]
    for server, why in f.unavailable.items():
        parts.append(unavailable(server, why))
    if "postgresql" not in f.unavailable:
        parts.append(_queue_table(f.queues))
        parts.append(f"top tenants by waiting ({f.tenant_count:,} in all)")
        parts.append(
            table(
                ["tenant", "waiting", "running", "claimed, not started", "dead"],
                [(t.name, t.waiting, t.running, t.prefetched, t.dead) for t in f.tenants],
            )
        )
        parts.append(f"{len(f.workers)} live worker(s)")
    if "redis" not in f.unavailable:
        parts.append(
            table(
                ["shard", "entries", "read, not loaded", "oldest s"],
                [
                    (s, v.get("entries"), v.get("pending"), v.get("oldest_age_seconds"))
                    for s, v in f.buffer.items()
                ],
            )
        )
        parts.append(f"dead letters: {f.dead_letters:,}")
    return "\n\n".join(parts)
