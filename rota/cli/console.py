"""`rota dashboard`: the operations console."""

from __future__ import annotations

import ipaddress
from typing import Annotated

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
from rota.errors import ValidationError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@app.command()
def dashboard(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8377,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = "127.0.0.1",
    log_level: LogLevel = "info",
    log_format: LogFormat = "text",
) -> None:
    """The web console: overview, tenants, tasks and why they wait, dead
    tasks and letters, workers; and its JSON API (/api/...). Loopback only
    unless ROTA_DASHBOARD_TOKEN is set, which every action needs too."""
    import uvicorn

    from rota import logs
    from rota.console.app import create_app
    from rota.console.data import Connections, figures
    from rota.metrics import FiguresCollector, HealthServer, process_registry

    logs.configure(log_level, log_format)
    settings = settings_from(database_url, redis_url)
    if not is_loopback(host) and settings.dashboard_token is None:
        raise ValidationError(
            f"listening on {host} needs ROTA_DASHBOARD_TOKEN (at least 16 characters); "
            "without it the console serves loopback only"
        )
    if metrics_port is not None:
        conns = Connections(settings)
        registry = process_registry()
        registry.register(FiguresCollector(lambda: figures(conns)))
        HealthServer(metrics_host, metrics_port, lambda: True, registry).start()
    typer.echo(f"rota console on http://{host}:{port}/", err=True)
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, access_log=False)
