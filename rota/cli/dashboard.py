"""`rota dashboard`: the operations console."""

from __future__ import annotations

from pathlib import Path
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


@app.command()
def dashboard(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8377,
    database_url: DatabaseUrl = None,
    redis_url: RedisUrl = None,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = "127.0.0.1",
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            help="a Host name the console answers to (repeat it; default: "
            "ROTA_CONSOLE_ALLOWED_HOSTS, loopback names)"
        ),
    ] = None,
    certfile: Annotated[Path | None, typer.Option(help="serve HTTPS with this certificate")] = None,
    keyfile: Annotated[Path | None, typer.Option(help="... and this private key")] = None,
    trusted_proxy: Annotated[
        list[str] | None,
        typer.Option(
            help="a proxy's address whose X-Forwarded-For/-Proto are believed (repeat it); "
            "by default none is"
        ),
    ] = None,
    log_level: LogLevel = "info",
    log_format: LogFormat = "text",
) -> None:
    """The web console: overview, tenants, tasks and why they wait, dead
    tasks and letters, workers; and its JSON API (/api/...). Loopback only
    unless a token is set (ROTA_DASHBOARD_TOKEN or ROTA_CONSOLE_TOKENS_FILE),
    which every action needs too."""
    import uvicorn

    from rota.dashboard.app import create_app
    from rota.readmodel.health import is_loopback, serve_health
    from rota.runtime import logs

    logs.configure(log_level, log_format)
    settings = settings_from(database_url, redis_url)
    if allowed_host:
        settings = settings.model_copy(update={"console_allowed_hosts": ",".join(allowed_host)})
    tokenless = settings.dashboard_token is None and settings.console_tokens_file is None
    if not is_loopback(host) and tokenless:
        raise ValidationError(
            f"listening on {host} needs ROTA_DASHBOARD_TOKEN (at least 16 characters) "
            "or ROTA_CONSOLE_TOKENS_FILE; without one the console serves loopback only"
        )
    if (certfile is None) != (keyfile is None):
        raise ValidationError("--certfile and --keyfile go together")
    app_ = create_app(settings)  # a bad tokens file fails here, before listening
    if metrics_port is not None:  # the console's own registry, on a port of its own
        registry = app_.state.console.registry
        serve_health(settings, metrics_host, metrics_port, lambda: True, registry)
    scheme = "https" if certfile else "http"
    typer.echo(f"rota console on {scheme}://{host}:{port}/", err=True)
    uvicorn.run(
        app_,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        ssl_certfile=str(certfile) if certfile else None,
        ssl_keyfile=str(keyfile) if keyfile else None,
        proxy_headers=bool(trusted_proxy),
        forwarded_allow_ips=",".join(trusted_proxy) if trusted_proxy else "",
    )


@app.command("dashboard-token")
def dashboard_token(
    name: Annotated[str, typer.Argument(help="who the token is for (the audit log's actor)")],
    scopes: Annotated[
        str, typer.Option(help="comma-separated: read, enqueue, act, metrics")
    ] = "read",
) -> None:
    """Makes a console token: prints it once, and the line for
    ROTA_CONSOLE_TOKENS_FILE (which keeps only its hash)."""
    import secrets

    from rota.dashboard.auth import parse_scopes, token_hash

    if not name or not all(c.isalnum() or c in "-_.@" for c in name):
        raise ValidationError("a token's name: letters, digits, - _ . @")
    chosen = parse_scopes(scopes)
    token = secrets.token_urlsafe(32)
    typer.echo(f"token (shown once): {token}", err=True)
    typer.echo(f"{name} {','.join(sorted(chosen))} {token_hash(token)}")
