"""`rota dev`: PostgreSQL and Redis for development, in the foreground, with
their data under `.rota/` and their URLs in `.env` (rota.runtime.embedded)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import typer

from rota.cli.app import app

DATA = Path(".rota")
ENV_FILE = Path(".env")
_URLS = ("ROTA_DATABASE_URL", "ROTA_REDIS_URL")
_MARK = "# rota dev: the embedded development servers (rota dev writes these two lines)"


@app.command()
def dev() -> None:
    """Development servers: PostgreSQL and Redis from the `embedded` extra,
    data in .rota/, URLs written to .env, migrated. Runs until Ctrl-C or
    SIGTERM, which stop both; the next `rota dev` here keeps the data. Not
    for production."""
    from rota.core import connections
    from rota.core.migrate import migrate
    from rota.runtime.embedded import start
    from rota.settings import Settings

    typer.echo(
        "rota dev: PostgreSQL and Redis for development only (loopback, no passwords, "
        "data in .rota/); in production rota uses servers of your own "
        "(docs/howto/setup.md)."
    )
    for name in _URLS:
        if name in os.environ:
            typer.echo(
                f"rota dev: {name} is set in this shell and overrides .env: unset it for "
                "the commands that should use these servers",
                err=True,
            )
    # SIGTERM (a process manager, `kill`) stops the servers as Ctrl-C does.
    signal.signal(signal.SIGTERM, _interrupt)
    servers = start(DATA)
    try:
        settings = Settings(database_url=servers.database_url, redis_url=servers.redis_url)
        with connections.connect(settings, "migrate") as conn:
            done = migrate(conn)
        if done.versions or done.functions:
            typer.echo("rota dev: schema created or upgraded (rota migrate)")
        write_env(
            ENV_FILE,
            {"ROTA_DATABASE_URL": servers.database_url, "ROTA_REDIS_URL": servers.redis_url},
        )
        typer.echo(f"PostgreSQL: {servers.database_url}")
        typer.echo(f"Redis:      {servers.redis_url}")
        typer.echo(
            "ready: written to .env, which rota's commands (rota worker, rota loader, "
            "rota dashboard, ...) and your code (rota.App.from_env()) read in this "
            "directory. Ctrl-C stops both servers; the data stays in .rota/.",
        )
        while (failed := servers.exited()) is None:
            time.sleep(0.5)
        typer.echo(f"rota: {failed}", err=True)
        raise typer.Exit(1)
    except KeyboardInterrupt:
        pass
    finally:
        servers.stop()
    typer.echo("rota dev: stopped both servers; the data stays in .rota/")


def write_env(path: Path, values: dict[str, str]) -> None:
    """Sets `values` in the dotenv file `path`, keeping its other lines."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        lines = []
    kept = [
        line
        for line in lines
        if line != _MARK and line.split("=", 1)[0].strip().removeprefix("export ") not in values
    ]
    text = "\n".join([*kept, _MARK, *(f"{k}={v}" for k, v in values.items())]) + "\n"
    # Whole or not at all: a command starting meanwhile reads one or the other.
    partial = path.with_name(f".{path.name}.rota-dev")
    partial.write_text(text)
    partial.replace(path)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
