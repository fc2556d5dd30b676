"""The `rota` command, one module per command group.

Other packages add commands through the `rota.commands` entry points (a
Typer app becomes a group, a function a command); they are loaded only when
named on the command line, or for the help that lists them.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

import typer

from rota.cli import admin, consumer, dashboard, dev, limits, loader, schema, tasks, tenants
from rota.cli.app import Options, app
from rota.cli.errors import explain
from rota.runtime.redact import printable

__all__ = [
    "admin",
    "app",
    "consumer",
    "dashboard",
    "dev",
    "limits",
    "loader",
    "main",
    "schema",
    "tasks",
    "tenants",
]


def add_plugins(argv: list[str]) -> None:
    """Registers the entry points' commands that `argv` may run."""
    words = [arg for arg in argv if not arg.startswith("-")]
    for point in entry_points(group="rota.commands"):
        if words and words[0] != point.name:
            continue
        command = point.load()
        if isinstance(command, typer.Typer):
            app.add_typer(command, name=point.name)
        else:
            app.command(point.name)(command)


def main() -> None:
    try:
        add_plugins(sys.argv[1:])
        app()
    except Exception as exc:
        if Options.debug:
            raise
        line, code = explain(exc)
        typer.echo(f"rota: {printable(line)}", err=True)
        raise SystemExit(code) from None
