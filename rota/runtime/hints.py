"""What to do about a connection error whose fix rota knows, in a few words:
said by the CLI's one-line errors and by every loop's outage log line."""

from __future__ import annotations

# By what the server (or a pooler in front of it) says.
_CONNECTION_FIXES = (
    (
        "startup parameter",
        "a connection pooler such as PgBouncer refuses rota's session settings: set "
        "ROTA_DATABASE_POOLING=transaction (and ROTA_DIRECT_DATABASE_URL for the commands "
        'that need a session: see "Behind PgBouncer" in docs/howto/postgresql.md)',
    ),
    ("password authentication failed", "check the password in ROTA_DATABASE_URL"),
    ("no password supplied", "put the password in ROTA_DATABASE_URL (or ~/.pgpass)"),
    ("does not exist", "check the role and database names in ROTA_DATABASE_URL"),
    ("no pg_hba.conf entry", "allow this host and role in the server's pg_hba.conf"),
    (
        "too many clients",
        "the server's max_connections is reached: raise it, or put PgBouncer in front "
        "(docs/howto/postgresql.md)",
    ),
)


def connection_fix(error: BaseException | str) -> str | None:
    """The fix for a refused PostgreSQL connection (the error, or what it
    said), if rota knows it."""
    text = str(error)
    for said, fix in _CONNECTION_FIXES:
        if said in text:
            return fix
    return None
