"""The root `rota` command, its global options, and what its commands share."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from rota.cli.output import Actor, AsJson, actor_or_default, emit
from rota.core.db import Op
from rota.runtime.redact import redact
from rota.settings import Settings

T = TypeVar("T")

app = typer.Typer(
    rich_markup_mode=None,
    help="rota: a fair, multi-tenant task queue.",
    no_args_is_help=True,
    # Locals may hold URLs with passwords: never shown.
    pretty_exceptions_show_locals=False,
)

DatabaseUrl = Annotated[
    str | None, typer.Option(help="PostgreSQL URL (default: ROTA_DATABASE_URL)")
]
RedisUrl = Annotated[str | None, typer.Option(help="Redis URL (default: ROTA_REDIS_URL)")]


class Options:
    debug = False


@app.callback()
def _options(
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks of errors")] = False,
) -> None:
    Options.debug = debug


def settings_from(database_url: str | None = None, redis_url: str | None = None) -> Settings:
    """ROTA_* settings, with the URLs given as options in their place."""
    overrides: dict[str, Any] = {}
    if database_url:
        overrides["database_url"] = database_url
    if redis_url:
        overrides["redis_url"] = redis_url
    if any(redact(url) != url for url in overrides.values()):
        typer.echo(
            "rota: a password on the command line shows in `ps`; give the URL in "
            "ROTA_DATABASE_URL / ROTA_REDIS_URL, or their _FILE forms",
            err=True,
        )
    return Settings(**overrides)


def load_app(spec: str) -> Any:
    """`package.module:attribute` -> the rota.App it names."""
    from rota.app import load_app as load

    sys.path.insert(0, os.getcwd())
    try:
        return load(spec)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def split_names(names: str | None) -> list[str]:
    return [n.strip() for n in (names or "").split(",") if n.strip()]


LogLevel = Annotated[str, typer.Option(help="debug, info, warning or error")]
LogFormat = Annotated[str, typer.Option(help="text, or json (one object per line)")]
MetricsPort = Annotated[
    int | None, typer.Option(help="serve /metrics, /healthz and /readyz on this port")
]
MetricsHost = Annotated[str, typer.Option(help="the address --metrics-port listens on")]


def run_admin(database_url: str | None, op: Op[T]) -> T:
    """Runs one operator's operation on an admin connection (rota.core.connections)."""
    from rota.core import connections, db

    with connections.connect(settings_from(database_url), "admin") as conn:
        return db.run(conn, op)


def add_pause_commands(
    group: typer.Typer, kind: str, pause: Callable[[str, bool, str], Op[bool]]
) -> None:
    """`rota KIND pause NAME` and `rota KIND resume NAME`; `pause(name,
    paused, actor)` is the operation, False when there is no such KIND."""

    def run(name: str, paused: bool, actor: str | None, as_json: bool, url: str | None) -> None:
        if not run_admin(url, pause(name, paused, actor_or_default(actor))):
            typer.echo(f"rota: no {kind} named {name!r}", err=True)
            raise typer.Exit(1)
        word = "paused" if paused else "resumed"
        emit({kind: name, "paused": paused}, as_json, lambda: f"{name}: {word}")

    def pause_command(
        name: str, actor: Actor = None, as_json: AsJson = False, database_url: DatabaseUrl = None
    ) -> None:
        run(name, True, actor, as_json, database_url)

    def resume_command(
        name: str, actor: Actor = None, as_json: AsJson = False, database_url: DatabaseUrl = None
    ) -> None:
        run(name, False, actor, as_json, database_url)

    pause_command.__doc__ = f"Pause a {kind}: its tasks stay in line, unclaimed, until resumed."
    resume_command.__doc__ = f"Resume a paused {kind}."
    group.command("pause")(pause_command)
    group.command("resume")(resume_command)
