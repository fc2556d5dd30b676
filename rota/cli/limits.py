"""`rota limit`: limits on keys other than the tenant (rota.Limit), listed
with their keys' counters, set, reset to the app's declaration, dropped."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from rota.cli.app import DatabaseUrl, app, run_admin
from rota.cli.output import Actor, AsJson, actor_or_default, emit, table

limit_app = typer.Typer(
    rich_markup_mode=None,
    help="Limits on keys (rota.Limit): list, set, reset to the app's declaration, drop.",
)
app.add_typer(limit_app, name="limit", no_args_is_help=True)


@limit_app.command("list")
def limit_list(as_json: AsJson = False, database_url: DatabaseUrl = None) -> None:
    """Every limit with its keys: running (all keys, and the busiest one) and
    parked (waiting for their key's room)."""
    from rota import core

    rows = run_admin(database_url, core.limits())
    emit([r._asdict() for r in rows], as_json, lambda: _limit_table(rows))


def _limit_table(rows: Any) -> str:
    headers = ["limit", "concurrency", "rate/s", "burst", "set by", "keys", "running"]
    return table(
        [*headers, "busiest", "parked"],
        [
            (
                r.name,
                "-" if r.concurrency is None else r.concurrency,
                "-" if r.rate is None else f"{r.rate:g}",
                f"{r.burst:g}" if r.rate is not None else "-",
                "code" if r.declared else "operator",
                r.keys,
                r.running,
                r.busiest_running,
                r.parked,
            )
            for r in rows
        ],
    )


@limit_app.command("set")
def limit_set(
    name: str,
    concurrency: Annotated[
        int | None, typer.Option(help="At most this many of each key's tasks running at once.")
    ] = None,
    rate: Annotated[
        float | None, typer.Option(help="At most this many of each key's tasks started a second.")
    ] = None,
    burst: Annotated[
        float | None, typer.Option(help="Starts allowed at once under --rate (default: the rate).")
    ] = None,
    actor: Actor = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Set a limit's numbers (those not given are cleared). An operator's
    setting holds over the app's declaration until `rota limit reset`."""
    from rota import core
    from rota.model.limits import Limit

    limit = Limit(name, concurrency=concurrency, rate=rate, burst=burst)
    run_admin(database_url, core.set_limit(limit, actor_or_default(actor)))
    said = {"limit": name, "concurrency": concurrency, "rate": rate, "burst": burst}
    emit(said, as_json, lambda: f"{name}: {_numbers(concurrency, rate, burst)}")


def _numbers(concurrency: int | None, rate: float | None, burst: float | None) -> str:
    parts = []
    if concurrency is not None:
        parts.append(f"at most {concurrency} running per key")
    if rate is not None:
        parts.append(f"{rate:g} starts/s per key" + (f", bursts of {burst:g}" if burst else ""))
    return "; ".join(parts) or "no numbers: its keys' tasks run unlimited"


@limit_app.command("reset")
def limit_reset(name: str, as_json: AsJson = False, database_url: DatabaseUrl = None) -> None:
    """Hand a limit back to the app's declaration (its workers set it at their next start)."""
    from rota import core

    if not run_admin(database_url, core.reset_limit(name)):
        typer.echo(f"rota: no limit named {name!r} (rota limit list shows them)", err=True)
        raise typer.Exit(1)
    emit({"limit": name, "declared": True}, as_json, lambda: f"{name}: as the app declares it")


@limit_app.command("drop")
def limit_drop(
    name: str, actor: Actor = None, as_json: AsJson = False, database_url: DatabaseUrl = None
) -> None:
    """Remove a limit: its keys' tasks run unlimited, the parked ones go back in line."""
    from rota import core

    if not run_admin(database_url, core.drop_limit(name, actor_or_default(actor))):
        typer.echo(f"rota: no limit named {name!r} (rota limit list shows them)", err=True)
        raise typer.Exit(1)
    emit({"limit": name, "dropped": True}, as_json, lambda: f"{name}: dropped")
