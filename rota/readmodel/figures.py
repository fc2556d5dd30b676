"""The operators' overview: queues, top tenants, workers, the buffer and its
dead letters, gathered from both servers, with what could not be read said
rather than raised. `gather` is its one gatherer: `rota stats`, the
console's overview page and API, and the overview's gauges all read it.

Reading only: the per-queue and per-tenant figures come from rota.stats as
maintenance last counted them (`counted_at` says when); a reader never
recounts, so a role that may only read sees the overview too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeAlias

import psycopg
import redis

from rota.buffer import deadletters, redis_client
from rota.buffer.streams import all_streams, buffer_stats
from rota.core import connections, db, history, read
from rota.runtime.redact import redact
from rota.settings import Settings

# Where a gatherer gets its servers: a PostgreSQL connection and a Redis
# client, each for the length of a `with`.
PostgresSource: TypeAlias = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]
RedisSource: TypeAlias = Callable[[], AbstractContextManager[redis_client.Client]]


@dataclass
class Figures:
    at: datetime
    queues: list[read.QueueRow] = field(default_factory=list)
    tenants: list[read.TopTenant] = field(default_factory=list)
    # The top tenants' service, demand and fair share (rota.core.history).
    fair: dict[str, history.FairShare] = field(default_factory=dict)
    tenant_count: int = 0
    workers: list[read.WorkerRow] = field(default_factory=list)
    loaders: list[read.LoaderBatch] = field(default_factory=list)
    buffer: dict[str, dict[str, float | int]] = field(default_factory=dict)
    dead_letters: int | None = None
    unavailable: dict[str, str] = field(default_factory=dict)  # server: why


def gather(
    settings: Settings,
    top: int = 10,
    postgres: PostgresSource | None = None,
    redis_source: RedisSource | None = None,
) -> Figures:
    """The overview with the `top` tenants by waiting tasks. Without sources
    it opens a connection and a client of its own, and closes them."""
    figures = Figures(datetime.now(UTC))
    try:
        with (postgres or _own_postgres(settings))() as conn:
            _postgres_figures(conn, top, figures)
    except psycopg.Error as exc:
        figures.unavailable["postgresql"] = _why(exc)
    try:
        with (redis_source or _own_redis(settings))() as client:
            _redis_figures(client, settings, figures)
    except (redis.RedisError, OSError) as exc:
        figures.unavailable["redis"] = _why(exc)
    return figures


def _postgres_figures(conn: psycopg.Connection[Any], top: int, figures: Figures) -> None:
    figures.queues = db.run(conn, read.queues())
    figures.tenants, figures.tenant_count = db.run(conn, read.top_tenants(max(1, top)))
    figures.fair = db.run(conn, history.fair_shares([t.name for t in figures.tenants]))
    figures.workers = db.run(conn, read.workers())
    figures.loaders = db.run(conn, read.loader_batches())


def _redis_figures(client: redis_client.Client, settings: Settings, figures: Figures) -> None:
    streams = all_streams(settings.stream_prefix, settings.shards)
    figures.buffer = buffer_stats(client, streams, settings.loader_group)
    figures.dead_letters = deadletters.count(client, settings.stream_prefix)


def _why(exc: BaseException) -> str:
    return redact(f"{type(exc).__name__}: {exc}".strip())


def _own_postgres(settings: Settings) -> PostgresSource:
    def connect() -> AbstractContextManager[psycopg.Connection[Any]]:
        return connections.connect(settings, "admin")

    return connect


def _own_redis(settings: Settings) -> RedisSource:
    @contextlib.contextmanager
    def connect() -> Iterator[redis_client.Client]:
        client = redis_client.connect(settings)
        try:
            yield client
        finally:
            client.close()

    return connect
