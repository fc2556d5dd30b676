"""`rota migrate`: the schema, and the least-privilege roles."""

from __future__ import annotations

from typing import Annotated

import typer

from rota.cli.app import DatabaseUrl, app, settings_from
from rota.core import connections


@app.command()
def migrate(
    roles: Annotated[
        bool, typer.Option(help="create rota_owner/_producer/_loader/_worker/_admin and grants")
    ] = False,
    print_roles: Annotated[
        bool, typer.Option(help="print the roles' SQL instead of running anything")
    ] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Create or upgrade rota's schema in one transaction (idempotent; safe beside live traffic)."""
    from rota.core.migrate import migrate as run_migrations
    from rota.core.migrate import roles_script
    from rota.sql import schema_version

    if print_roles:
        typer.echo(roles_script(), nl=False)
        return

    def retrying(waited: float, attempt: int) -> None:
        typer.echo(
            f"rota migrate: waited {waited:.1f}s for a lock held by live traffic; "
            f"trying again (attempt {attempt})",
            err=True,
        )

    with connections.connect(settings_from(database_url), "migrate") as conn:
        done = run_migrations(conn, roles=roles, on_retry=retrying)
    if done.newer is not None:
        typer.echo(
            f"the database is at schema {done.newer}, newer than this rota's "
            f"{schema_version().version}: left as it is"
        )
        return
    if done.versions:
        typer.echo(f"applied migrations: {done.versions}")
    if done.functions:
        typer.echo(f"applied function files: {', '.join(done.functions)}")
    if not done.versions and not done.functions:
        typer.echo("schema is up to date")
    if roles:
        typer.echo("roles rota_owner, rota_producer, rota_loader, rota_worker, rota_admin ready")
