"""The operators' overview: queues, top tenants, workers, the buffer and its
dead letters, gathered from both servers, with what could not be read said
rather than raised. `rota stats`, the console's overview and the metrics
read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
import redis

from rota.buffer import deadletters, redis_client
from rota.buffer.streams import all_streams, buffer_stats
from rota.core import db, maintain, read
from rota.runtime.redact import redact
from rota.settings import Settings


@dataclass
class Figures:
    at: datetime
    queues: list[read.QueueRow] = field(default_factory=list)
    tenants: list[read.TopTenant] = field(default_factory=list)
    tenant_count: int = 0
    workers: list[read.WorkerRow] = field(default_factory=list)
    loaders: list[read.LoaderBatch] = field(default_factory=list)
    buffer: dict[str, dict[str, float | int]] = field(default_factory=dict)
    dead_letters: int | None = None
    unavailable: dict[str, str] = field(default_factory=dict)  # server: why


# A reader counts the figures itself only when maintenance has not for this
# many intervals (no worker or reaper running, say): a count reads every
# waiting task, and under load it would compete with the claims.
STALE_INTERVALS = 12


def _stale(queues: list[read.QueueRow], settings: Settings, now: datetime) -> bool:
    """Whether maintenance has not counted lately."""
    times = [q.counted_at for q in queues if q.counted_at is not None]
    if not times:
        return bool(queues)
    return (now - min(times)).total_seconds() > STALE_INTERVALS * settings.stats_seconds


def postgres_figures(
    conn: psycopg.Connection[Any], settings: Settings, top: int, figures: Figures
) -> None:
    queues = db.run(conn, read.queues())
    if _stale(queues, settings, figures.at):
        db.run(conn, maintain.refresh_stats())
        queues = db.run(conn, read.queues())
    figures.queues = queues
    figures.tenants, figures.tenant_count = db.run(conn, read.top_tenants(max(1, top)))
    figures.workers = db.run(conn, read.workers())
    figures.loaders = db.run(conn, read.loader_batches())


def redis_figures(client: redis_client.Client, settings: Settings, figures: Figures) -> None:
    streams = all_streams(settings.stream_prefix, settings.shards)
    figures.buffer = buffer_stats(client, streams, settings.loader_group)
    figures.dead_letters = deadletters.count(client, settings.stream_prefix)


def gather(settings: Settings, top: int = 10) -> Figures:
    figures = Figures(datetime.now(UTC))
    try:
        with db.admin_connect(
            settings.database_url,
            pooled=settings.transaction_pooling,
            connect_timeout=settings.database_timeout_seconds,
        ) as conn:
            postgres_figures(conn, settings, top, figures)
    except psycopg.Error as exc:
        figures.unavailable["postgresql"] = redact(f"{type(exc).__name__}: {exc}".strip())
    client: redis_client.Client | None = None
    try:
        client = redis_client.connect(settings)
        redis_figures(client, settings, figures)
    except (redis.RedisError, OSError) as exc:
        figures.unavailable["redis"] = redact(f"{type(exc).__name__}: {exc}".strip())
    finally:
        if client is not None:
            client.close()
    return figures
