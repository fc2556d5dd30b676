"""Operators' commands about tenants, queues and figures: `rota tenant`,
`rota queue`, `rota prune` and `rota stats`."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from rota.cli.app import DatabaseUrl, RedisUrl, app, run_admin, settings_from
from rota.cli.output import Actor, AsJson, Progress, actor_or_default, cell, emit, table
from rota.errors import ValidationError

# `rota tenant NAME ...` changes a tenant, unless NAME is one of these words;
# `rota tenant set NAME ...` changes any tenant, one named `list` too.
TENANT_ACTIONS = ("list", "show", "pause", "resume", "set")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


@app.command()
def tenant(
    words: Annotated[
        list[str],
        typer.Argument(
            help="NAME (or set NAME) to create or change it; or list, show NAME, "
            "pause NAME, resume NAME"
        ),
    ],
    weight: Annotated[float | None, typer.Option(help="share of turns relative to others")] = None,
    concurrency_limit: Annotated[int | None, typer.Option(help="max running fleet-wide")] = None,
    rate_limit: Annotated[float | None, typer.Option(help="tasks per second")] = None,
    rate_burst: Annotated[float | None, typer.Option(help="token bucket size")] = None,
    capacity: Annotated[int | None, typer.Option(help="max waiting work (cost units)")] = None,
    clear: Annotated[
        list[str] | None,
        typer.Option(help="a limit to clear: concurrency_limit, rate_limit or capacity"),
    ] = None,
    sort: Annotated[str, typer.Option(help="list: name, waiting, running, dead, ...")] = "waiting",
    ascending: Annotated[bool, typer.Option(help="list: smallest first")] = False,
    prefix: Annotated[str, typer.Option(help="list: names starting with this")] = "",
    limit: Annotated[int, typer.Option(help="list: at most this many")] = 50,
    offset: Annotated[int, typer.Option(help="list: skip this many")] = 0,
    actor: Actor = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Tenants: `rota tenant NAME --weight 3` (or `rota tenant set NAME ...`,
    for a tenant named like an action) changes only the options given
    (--clear rate_limit removes a limit); `list`, `show NAME`, `pause NAME`,
    `resume NAME`."""
    from rota import core
    from rota.core import connections, db, read

    action, names = (words[0], words[1:]) if words[0] in TENANT_ACTIONS else ("set", words)
    changing = (weight, concurrency_limit, rate_limit, rate_burst, capacity, clear)
    if action != "set" and any(option is not None for option in changing):
        raise typer.BadParameter(
            f"`rota tenant {action}` changes nothing; to change a tenant named "
            f"{action!r}: rota tenant set {action} ..."
        )
    if action == "list":
        if names:
            raise typer.BadParameter("`rota tenant list` takes no name")
        listing = read.tenants(
            sort=sort, descending=not ascending, prefix=prefix, offset=offset, limit=limit
        )
        page = run_admin(database_url, listing)
        emit(page, as_json, lambda: _tenant_table(page))
        return
    if len(names) != 1:
        raise typer.BadParameter(f"`rota tenant {action}` takes one tenant name")
    (name,) = names
    if action == "show":
        detail = read.tenant(name)
        shown = run_admin(database_url, detail)
        if shown is None:
            typer.echo(f"rota: no tenant named {name!r}", err=True)
            raise typer.Exit(1)
        emit(shown, as_json, lambda: _tenant_text(shown))
        return
    who = actor_or_default(actor)
    if action in ("pause", "resume"):
        op = core.pause_tenant(name, action == "pause", who)
        found = run_admin(database_url, op)
        if not found:
            typer.echo(f"rota: no tenant named {name!r}", err=True)
            raise typer.Exit(1)
        emit({"tenant": name, "paused": action == "pause"}, as_json, lambda: f"{name}: {action}d")
        return
    given = {
        "weight": weight,
        "concurrency_limit": concurrency_limit,
        "rate_limit": rate_limit,
        "rate_burst": rate_burst,
        "capacity": capacity,
    }
    changes: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    for setting in clear or []:
        if setting not in ("concurrency_limit", "rate_limit", "capacity"):
            raise ValidationError(
                f"--clear takes concurrency_limit, rate_limit or capacity, not {setting!r}"
            )
        if setting in changes:
            raise ValidationError(f"{setting} is both given and cleared")
        changes[setting] = None
    patch = core.patch_tenant(name, changes, who)
    with connections.connect(settings_from(database_url), "admin") as conn:
        slot = db.run(conn, patch)
        shown = db.run(conn, read.tenant(name))
    emit(
        {"tenant": name, "slot": slot, "changed": changes, "now": shown},
        as_json,
        lambda: _tenant_text(shown) if shown else name,
    )


def _tenant_table(page: Any) -> str:
    rows = [
        (
            t.name,
            t.weight,
            "yes" if t.paused else "",
            t.waiting,
            f"{t.running}/{t.concurrency_limit}" if t.concurrency_limit is not None else t.running,
            t.tokens,
            t.capacity,
            t.dead,
            t.oldest_wait_seconds,
            t.served,
            _pct(t.share),
            _pct(t.fair_share),
        )
        for t in page.rows
    ]
    headers = [
        "tenant",
        "weight",
        "paused",
        "waiting",
        "running",
        "tokens",
        "capacity",
        "dead",
        "oldest wait s",
        "served 5 min",
        "share",
        "fair share",
    ]
    return f"{page.total:,} tenant(s)\n" + table(headers, rows)


def _tenant_text(t: Any) -> str:
    limits = [
        f"weight {t.weight:g}",
        f"concurrency {t.running}/{t.concurrency_limit}" if t.concurrency_limit is not None else "",
        f"rate {t.rate_limit:g}/s (burst {t.rate_burst:g}, tokens {t.tokens:.1f})"
        if t.rate_limit is not None and t.tokens is not None
        else "",
        f"capacity {t.capacity:,} (waiting work ~{t.backlog or 0:,.0f})"
        if t.capacity is not None
        else "",
        "PAUSED" if t.paused else "",
    ]
    per_queue = table(
        ["queue", "waiting", "claimed", "scheduled", "dead", "oldest wait s"],
        [
            (q.queue, q.waiting, q.running, q.scheduled, q.dead, q.oldest_wait_seconds)
            for q in t.queues
        ],
    )
    served = sum(n for _, n, _ in t.service)
    share = t.fair_share_per_minute
    fair = (
        f"per minute over the last {t.fair_minutes} whole minutes: served "
        f"{t.served_per_minute:,.1f}, asked for {t.demand_per_minute:,.1f} "
        f"(completed, waiting or claimed), max-min fair share "
        + ("not kept" if share is None else f"{share:,.1f}")
    )
    return (
        f"tenant {t.name} (slot {t.slot}): "
        + ", ".join(x for x in limits if x)
        + f"\n{per_queue}\nserved in the last hour: {served:,}\n{fair}"
    )


queue_app = typer.Typer(
    rich_markup_mode="markdown", help="Queues: list, pause, resume, charge by time or cost."
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
        ["queue", "paused", "waiting", "running", "scheduled", "dead", "per min", "oldest wait s"],
        [
            (
                q.name,
                "yes" if q.paused else "",
                q.waiting,
                q.running,
                q.scheduled,
                q.dead,
                q.per_minute,
                q.oldest_wait_seconds,
            )
            for q in queues
        ],
    )


def _pause_queue(
    name: str, paused: bool, actor: str | None, as_json: bool, url: str | None
) -> None:
    from rota import core

    op = core.pause_queue(name, paused, actor_or_default(actor))
    found = run_admin(url, op)
    if not found:
        typer.echo(f"rota: no queue named {name!r}", err=True)
        raise typer.Exit(1)
    word = "paused" if paused else "resumed"
    emit({"queue": name, "paused": paused}, as_json, lambda: f"{name}: {word}")


@queue_app.command("pause")
def queue_pause(
    name: str, actor: Actor = None, as_json: AsJson = False, database_url: DatabaseUrl = None
) -> None:
    """Pause a queue: its tasks stay in line, unclaimed, until resumed."""
    _pause_queue(name, True, actor, as_json, database_url)


@queue_app.command("resume")
def queue_resume(
    name: str, actor: Actor = None, as_json: AsJson = False, database_url: DatabaseUrl = None
) -> None:
    """Resume a paused queue."""
    _pause_queue(name, False, actor, as_json, database_url)


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
        parts.append(f"{server} unavailable: {why}")
    if "postgresql" not in f.unavailable:
        parts.append(_queue_table(f.queues))
        parts.append(f"top tenants by waiting ({f.tenant_count:,} in all)")
        parts.append(
            table(
                ["tenant", "waiting", "running", "dead"],
                [(t.name, t.waiting, t.running, t.dead) for t in f.tenants],
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
