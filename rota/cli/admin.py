"""Operators' commands: tenants and figures."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from rota.cli.app import DatabaseUrl, RedisUrl, app, settings_from


@app.command()
def tenant(
    name: Annotated[str, typer.Argument(help="the tenant's name")],
    weight: Annotated[float, typer.Option(help="share of turns relative to others")] = 1.0,
    concurrency_limit: Annotated[int | None, typer.Option(help="max running fleet-wide")] = None,
    rate_limit: Annotated[float | None, typer.Option(help="tasks per second")] = None,
    rate_burst: Annotated[float | None, typer.Option(help="token bucket size")] = None,
    capacity: Annotated[int | None, typer.Option(help="max waiting work (cost units)")] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Create or change a tenant (options not given are cleared)."""
    from rota import db, ops

    # Checked here, before connecting: bad input is told as such.
    configure = ops.configure_tenant(
        name,
        weight=weight,
        concurrency_limit=concurrency_limit,
        rate_limit=rate_limit,
        rate_burst=rate_burst,
        capacity=capacity,
    )
    with db.connect(settings_from(database_url).database_url) as conn:
        slot = db.transact(conn, configure)
    typer.echo(
        json.dumps(
            {
                "tenant": name,
                "slot": slot,
                "weight": weight,
                "concurrency_limit": concurrency_limit,
                "rate_limit": rate_limit,
                "rate_burst": rate_burst,
                "capacity": capacity,
            }
        )
    )


@app.command()
def stats(
    output: Annotated[str, typer.Option("--format", help="json or prometheus")] = "json",
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
) -> None:
    """Buffer depth and oldest entry per shard, and the queues' counts."""
    from rota import db, ops
    from rota.loader import Loader
    from rota.metrics import prometheus_text

    settings = settings_from(database_url, redis_url)
    loader = Loader(settings)
    try:
        buffer = loader.buffer_stats()
    finally:
        loader.close()
    with db.connect(settings.database_url) as conn:
        queues = db.run(conn, ops.queue_counts())
    if output == "prometheus":
        typer.echo(prometheus_text(buffer, queues), nl=False)
    else:
        typer.echo(json.dumps({"buffer": buffer, "queues": queues}, indent=2))
