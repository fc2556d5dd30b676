"""The `rota` command."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated, Any

import psycopg
import typer

from rota.settings import Settings

app = typer.Typer(help="rota: a fair, multi-tenant task queue.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks; JSON figures with their baselines.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

DatabaseUrl = Annotated[
    str | None, typer.Option(help="PostgreSQL URL (default: ROTA_DATABASE_URL)")
]


def _settings(database_url: str | None = None, redis_url: str | None = None) -> Settings:
    overrides: dict[str, Any] = {}
    if database_url:
        overrides["database_url"] = database_url
    if redis_url:
        overrides["redis_url"] = redis_url
    return Settings(**overrides)


@app.command()
def migrate(database_url: DatabaseUrl = None) -> None:
    """Create or upgrade rota's schema (idempotent; concurrent runs take turns)."""
    from rota.migrate import migrate as run_migrations

    with psycopg.connect(_settings(database_url).database_url, autocommit=True) as conn:
        applied = run_migrations(conn)
    typer.echo(f"applied migrations: {applied}" if applied else "schema is up to date")


@contextlib.contextmanager
def _bench_database(database_url: str | None, local: bool | None) -> Iterator[str]:
    """The database to benchmark: the given one, or a throwaway local server."""
    use_local = (
        local if local is not None else not (database_url or "ROTA_DATABASE_URL" in os.environ)
    )
    if not use_local:
        yield _settings(database_url).database_url
        return
    from rota.devservers import local_postgres

    with local_postgres() as server:
        yield server.url


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


@bench_app.command("load")
def bench_load(
    tasks: int = 200_000,
    tenants: int = 1000,
    runs: int = 3,
    database_url: DatabaseUrl = None,
    local: Local = None,
    as_json: AsJson = False,
) -> None:
    """Fair bulk loading vs raw COPY of the same rows."""
    from rota.bench.core import bench_load as run

    with _bench_database(database_url, local) as url:
        _report("load", run(url, tasks, tenants, runs), as_json)


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
    """Claim + complete throughput, and claim latency by backlog and after churn."""
    from rota.bench.core import bench_claim as run

    sizes = [int(b) for b in backlogs.split(",")]
    with _bench_database(database_url, local) as url:
        _report(
            "claim",
            run(url, sizes, tenants, connections, claim_size, samples, seconds, runs),
            as_json,
        )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
