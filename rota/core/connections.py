"""Every PostgreSQL connection rota opens, made here from the settings and
what it is for (its `Purpose`).

    conn = connections.connect(settings, "claims")
    conn = await connections.aconnect(settings, "enqueue")
    pool = connections.pool(settings, "console", size=4)

One place applies what a connection needs: the URL (the direct one for a
session that keeps state behind a transaction pooler), pooling (no startup
options and no prepared statements behind a transaction pooler), the time
opening it may take (ROTA_DATABASE_TIMEOUT_SECONDS), the bounds of every
wait on the network (ROTA_DATABASE_DEAD_LINK_SECONDS, rota.runtime.links), the
application name pg_stat_activity shows, and the session's settings: rota's
planner settings for its own statements, the server's own for operators'
ad-hoc reads. TLS, and anything else libpq takes, comes from the URL, and
what the URL names (options, connect_timeout, application_name, keepalives)
it keeps. Nothing here runs per statement: only when a connection opens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import psycopg
from psycopg.conninfo import conninfo_to_dict

from rota.runtime.links import link, server_link

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    from rota.settings import Settings

Purpose = Literal[
    "claims",  # a worker's claims and reports
    "heartbeat",  # a worker's heartbeats, and maintenance while it leads
    "listen",  # a worker's LISTEN for new tasks and cancels
    "maintenance",  # `rota maintenance`: the maintenance lock and duties
    "load",  # the loaders and `rota import`
    "enqueue",  # the producers: the database fallback, transactional enqueues
    "results",  # a task's status and result
    "wait",  # waiting on a task's result (LISTEN, when there is a session)
    "admin",  # the CLI's reads and actions, archives
    "console",  # `rota dashboard`
    "migrate",  # `rota migrate`
]


class Use(NamedTuple):
    application_name: str
    # Keeps session state (LISTEN, a session-level lock): goes to
    # Settings.session_database_url, never through a transaction pooler.
    session: bool = False
    # Operators' ad-hoc reads and actions: the server's planner settings,
    # so that a read is planned for what it reads.
    operator: bool = False


USES: dict[str, Use] = {
    "claims": Use("rota-worker"),
    "heartbeat": Use("rota-worker"),
    "listen": Use("rota-worker", session=True),
    "maintenance": Use("rota-maintenance", session=True),
    "load": Use("rota-loader"),
    "enqueue": Use("rota-producer"),
    "results": Use("rota-results"),
    "wait": Use("rota-results", session=True),
    "admin": Use("rota-admin", operator=True),
    "console": Use("rota-console", operator=True),
    "migrate": Use("rota-migrate", operator=True),
}

# PostgreSQL keeps this much of an application_name (NAMEDATALEN - 1).
APPLICATION_NAME_MAX = 63

# rota's statements are prepared (psycopg does so after a few runs) and their
# plans do not depend on the values: a generic plan saves the claim the
# planning that custom plans would spend on every call. A generic plan lives as
# long as the session (until the next ANALYZE of its tables), so it must not
# depend on the statistics either: planned while the queue was empty, the
# claim would sort a sequential scan of the whole ready table on every call.
# Every statement of rota's is driven by an index (tests/integration/
# test_claim_plan.py). JIT is off: a scan that is still sequential (a small
# table without an index for the filter) is costed at 1e10 when disabled,
# which makes PostgreSQL JIT-compile such statements on every run; rota's
# statements are short and never gain from it.
SESSION_SETTINGS = {"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off", "jit": "off"}
CONNECTION_OPTIONS = " ".join(f"-c {name}={value}" for name, value in SESSION_SETTINGS.items())


def application_name(purpose: Purpose, who: str | None = None) -> str:
    """What pg_stat_activity shows for a connection: rota-worker, or with
    `who` rota-worker:<who> (the tail kept, should it be too long)."""
    name = USES[purpose].application_name
    return name if who is None else f"{name}:{who}"[-APPLICATION_NAME_MAX:]


def arguments(
    settings: Settings, purpose: Purpose, *, who: str | None = None, **overrides: Any
) -> tuple[str, dict[str, Any]]:
    """The URL and psycopg's connection arguments for `purpose`: what
    `connect`, `aconnect` and `pool` open with. `overrides` win over what
    the settings give (the libpq parameters of the network bounds, say)."""
    use = USES[purpose]
    url, pooled = settings.database_url, settings.transaction_pooling
    if use.session and settings.session_database_url is not None:
        url, pooled = settings.session_database_url, False
    named = conninfo_to_dict(url)
    kwargs: dict[str, Any] = {"autocommit": True}
    if "connect_timeout" not in named:
        kwargs["connect_timeout"] = settings.database_timeout_seconds
    if "application_name" not in named:
        kwargs["application_name"] = application_name(purpose, who)
    kwargs.update(link(settings.database_dead_link_seconds, url))
    kwargs.update(overrides)
    if pooled:
        # A transaction pooler refuses most startup options, so behind one
        # the settings go on the role instead (docs/howto/postgresql.md,
        # "Behind PgBouncer"). Nothing is prepared either: the next
        # transaction may run on another server session, which never saw
        # the statement.
        kwargs["prepare_threshold"] = None
    elif "options" not in named:
        options = session_options(settings, purpose, kwargs)
        if options:
            kwargs["options"] = options
    return url, kwargs


def session_options(settings: Settings, purpose: Purpose, kwargs: Mapping[str, Any]) -> str:
    """The session's settings as startup options: rota's planner settings
    (or for operators a statement timeout, in the console), workers' claims
    and reports without waiting for the WAL flush if the settings say so
    (Settings.worker_synchronous_commit: what a commit must not forget,
    such as a load the buffer is then acknowledged for, keeps the default),
    and the dead-link bound asked of the server's end (`kwargs`' link)."""
    if USES[purpose].operator:
        timeout = settings.console_statement_timeout_seconds if purpose == "console" else None
        own = "" if timeout is None else f"-c statement_timeout={int(timeout * 1000)}"
    else:
        own = CONNECTION_OPTIONS
        if purpose == "claims" and not settings.worker_synchronous_commit:
            own += " -c synchronous_commit=off"
    return (own + server_link(kwargs)).strip()


def connect(
    settings: Settings, purpose: Purpose, *, who: str | None = None, **overrides: Any
) -> psycopg.Connection[Any]:
    """A connection for `purpose` (`arguments`); `who` names the process in
    its application name (a worker's heartbeat, which may hold the
    maintenance lock)."""
    url, kwargs = arguments(settings, purpose, who=who, **overrides)
    return psycopg.connect(url, **kwargs)


async def aconnect(
    settings: Settings, purpose: Purpose, *, who: str | None = None, **overrides: Any
) -> psycopg.AsyncConnection[Any]:
    """`connect`, for asyncio."""
    url, kwargs = arguments(settings, purpose, who=who, **overrides)
    return await psycopg.AsyncConnection.connect(url, **kwargs)


def pool(
    settings: Settings,
    purpose: Purpose,
    *,
    size: int,
    configure: Callable[[psycopg.Connection[Any]], Any] | None = None,
) -> ConnectionPool[Any]:
    """Up to `size` connections for `purpose`, shared by threads, opened as
    needed. A connection is checked as it is handed out, so that one a
    server restart or a dead link left behind is replaced, not used; one
    returned broken, or in a transaction it cannot roll back, is closed. A
    connection is waited for at most ROTA_DATABASE_TIMEOUT_SECONDS
    (psycopg_pool.PoolTimeout, an OperationalError, after that).
    `configure` is called with each new connection before it is handed out."""
    from psycopg_pool import ConnectionPool

    url, kwargs = arguments(settings, purpose)
    return ConnectionPool(
        url,
        kwargs=kwargs,
        min_size=0,
        max_size=size,
        open=True,
        check=ConnectionPool.check_connection,
        configure=configure,
        timeout=settings.database_timeout_seconds,
        name=kwargs.get("application_name", purpose),
    )


def at(url: str, *, pooled: bool = False, synchronous_commit: bool = True) -> Settings:
    """Settings that reach `url` and are otherwise the defaults (not read
    from the environment): for a connection made from a URL alone
    (rota.core.db.connect). `synchronous_commit=False`: claims do not wait
    for the WAL flush."""
    from rota.settings import Settings

    return Settings.model_construct(
        database_url=url,
        database_pooling="transaction" if pooled else "none",
        worker_synchronous_commit=synchronous_commit,
    )
