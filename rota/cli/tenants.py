"""`rota tenant`: list, show, pause, resume and change tenants.

`rota tenant NAME --weight 3` is short for `rota tenant set NAME --weight 3`:
a first word that names no sub-command is a tenant's name.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from rota.cli.app import DatabaseUrl, add_pause_commands, app, run_admin, settings_from
from rota.cli.output import Actor, AsJson, actor_or_default, emit, table
from rota.core.db import Op
from rota.errors import ValidationError

# The options only `set` takes: given to another sub-command, they most
# likely meant a tenant named like it (`rota tenant set list --weight 2`).
CHANGES = (
    "--weight",
    "--concurrency-limit",
    "--rate-limit",
    "--rate-burst",
    "--capacity",
    "--clear",
)


class TenantGroup(TyperGroup):
    """Sub-commands, with `set` taken when the first word names none."""

    # The context is the click Typer bundles (a private module): typed Any.
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        first = args[0] if args else None
        if first is not None and first not in self.commands and first not in ctx.help_option_names:
            args = ["set", *args]
        elif first in self.commands and first != "set":
            changing = next((a for a in args if a.split("=")[0] in CHANGES), None)
            if changing is not None:
                raise typer.BadParameter(
                    f"`rota tenant {first}` changes nothing ({changing.split('=')[0]}); "
                    f"to change a tenant named {first!r}: rota tenant set {first} ...",
                    ctx=ctx,
                )
        return super().parse_args(ctx, args)


tenant_app = typer.Typer(
    cls=TenantGroup,
    rich_markup_mode=None,
    help="Tenants: `rota tenant NAME --weight 3` changes one (short for `set`); "
    "list, show, pause, resume.",
)
app.add_typer(tenant_app, name="tenant", no_args_is_help=True)


@tenant_app.command("list")
def tenant_list(
    sort: Annotated[
        str, typer.Option(help="name, waiting, running, dead, oldest_wait, served or weight")
    ] = "waiting",
    ascending: Annotated[bool, typer.Option(help="smallest first")] = False,
    prefix: Annotated[str, typer.Option(help="names starting with this")] = "",
    limit: Annotated[int, typer.Option(help="at most this many")] = 50,
    offset: Annotated[int, typer.Option(help="skip this many")] = 0,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Tenants with their limits and figures, a page at a time: served, fair
    share and demand per minute over the last 5 whole minutes, as the
    console shows them."""
    from rota.core import read

    listing = read.tenants(
        sort=sort, descending=not ascending, prefix=prefix, offset=offset, limit=limit
    )
    page = run_admin(database_url, listing)
    emit(page, as_json, lambda: _tenant_table(page))


@tenant_app.command("show")
def tenant_show(name: str, as_json: AsJson = False, database_url: DatabaseUrl = None) -> None:
    """One tenant: limits, queues, what it was served and its fair share."""
    from rota.core import read

    shown = run_admin(database_url, read.tenant(name))
    if shown is None:
        typer.echo(f"rota: no tenant named {name!r}", err=True)
        raise typer.Exit(1)
    emit(shown, as_json, lambda: _tenant_text(shown))


def _pause_tenant(name: str, paused: bool, actor: str) -> Op[bool]:
    from rota import core

    return core.pause_tenant(name, paused, actor)


add_pause_commands(tenant_app, "tenant", _pause_tenant)


@tenant_app.command("set")
def tenant_set(
    name: str,
    weight: Annotated[float | None, typer.Option(help="share of turns relative to others")] = None,
    concurrency_limit: Annotated[int | None, typer.Option(help="max running fleet-wide")] = None,
    rate_limit: Annotated[float | None, typer.Option(help="tasks per second")] = None,
    rate_burst: Annotated[float | None, typer.Option(help="token bucket size")] = None,
    capacity: Annotated[int | None, typer.Option(help="max waiting work (cost units)")] = None,
    clear: Annotated[
        list[str] | None,
        typer.Option(help="a limit to clear: concurrency_limit, rate_limit or capacity"),
    ] = None,
    actor: Actor = None,
    as_json: AsJson = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Create a tenant or change the options given (--clear rate_limit removes a limit)."""
    from rota import core
    from rota.core import connections, db, read

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
    patch = core.patch_tenant(name, changes, actor_or_default(actor))
    with connections.connect(settings_from(database_url), "admin") as conn:
        slot = db.run(conn, patch)
        shown = db.run(conn, read.tenant(name))
    emit(
        {"tenant": name, "slot": slot, "changed": changes, "now": shown},
        as_json,
        lambda: _tenant_text(shown) if shown else name,
    )


def _tenant_table(page: Any) -> str:
    from rota.core.history import FAIR_MINUTES

    rows = [
        (
            t.name,
            t.weight,
            "yes" if t.paused else "",
            t.waiting,
            t.running,
            f"{t.claimed}/{t.concurrency_limit}" if t.concurrency_limit is not None else t.claimed,
            t.tokens,
            t.capacity,
            t.dead,
            t.oldest_wait_seconds,
            _fair_text(t),
        )
        for t in page.rows
    ]
    headers = [
        "tenant",
        "weight",
        "paused",
        "waiting",
        "running",
        "claimed/limit",
        "tokens",
        "capacity",
        "dead",
        "oldest wait s",
        f"per minute, last {FAIR_MINUTES} whole minutes",
    ]
    return f"{page.total:,} tenant(s)\n" + table(headers, rows)


def _fair_text(t: Any) -> str:
    """The console's wording of served, fair share and demand per minute."""
    from rota.core.history import wording

    return wording(
        t.served_per_minute, t.fair_share_per_minute, t.demand_per_minute, t.fair_standing
    )


def _tenant_text(t: Any) -> str:
    limits = [
        f"weight {t.weight:g}",
        f"claimed/concurrency {t.running}/{t.concurrency_limit}"
        if t.concurrency_limit is not None
        else "",
        f"rate {t.rate_limit:g}/s (burst {t.rate_burst:g}, tokens {t.tokens:.1f})"
        if t.rate_limit is not None and t.tokens is not None
        else "",
        f"capacity {t.capacity:,} (waiting work ~{t.backlog or 0:,.0f})"
        if t.capacity is not None
        else "",
        "PAUSED" if t.paused else "",
    ]
    per_queue = table(
        [
            "queue",
            "waiting",
            "running",
            "claimed, not started",
            "scheduled",
            "dead",
            "oldest wait s",
        ],
        [
            (
                q.queue,
                q.waiting,
                q.running,
                q.prefetched,
                q.scheduled,
                q.dead,
                q.oldest_wait_seconds,
            )
            for q in t.queues
        ],
    )
    served = sum(n for _, n, _ in t.service)
    fair = (
        f"per minute over the last {t.fair_minutes} whole minutes: {_fair_text(t)} "
        "(demand: completed, or unfinished at the window's end)"
    )
    return (
        f"tenant {t.name}: "
        + ", ".join(x for x in limits if x)
        + f"\n{per_queue}\nserved in the last hour: {served:,}\n{fair}"
    )
