"""Small helpers shared by the test tiers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import psycopg

from rota import core
from rota.core import db
from rota.model.envelope import TaskEnvelope, make_envelope


def envelopes(
    tenant: str,
    count: int,
    *,
    queue: str = "default",
    name: str = "tests.noop",
    cost: float = 1.0,
    eta: datetime | None = None,
    max_attempts: int = 3,
    backoff_base: float = 1.0,
    priority: int = 0,
) -> list[TaskEnvelope]:
    return [
        make_envelope(
            name=name,
            queue=queue,
            tenant=tenant,
            args=[i],
            cost=cost,
            eta=eta,
            max_attempts=max_attempts,
            backoff_base=backoff_base,
            priority=priority,
        )
        for i in range(count)
    ]


def load(conn: psycopg.Connection[Any], batch: Iterable[TaskEnvelope]) -> int:
    return db.transact(conn, core.load(list(batch)))


def claim(
    conn: psycopg.Connection[Any],
    limit: int = 100,
    queues: tuple[str, ...] = ("default",),
    worker: str = "test-worker",
    lease_seconds: float = 60.0,
) -> list[core.ClaimedTask]:
    return db.transact(conn, core.claim(list(queues), limit, worker, lease_seconds))


def drain_order(conn: psycopg.Connection[Any], batch: int = 1) -> list[str]:
    """Claims and completes everything, one batch at a time; returns tenants in claim order."""
    order: list[str] = []
    while True:
        got = claim(conn, batch)
        if not got:
            return order
        order.extend(t.tenant for t in got)
        db.transact(conn, core.complete(t.token for t in got))


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "the condition") -> Any:
    """Polls `check` until it returns something truthy (returned), or fails
    the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def waiting_on_a_lock(conn: psycopg.Connection[Any], pid: int) -> bool:
    """Whether the backend `pid` waits for a lock (seen in pg_locks)."""
    row = conn.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [pid])
    return bool(row.fetchone()[0])  # type: ignore[index]


def pending_idle_past_reclaim(settings: Any) -> bool:
    """Whether the buffer has entries read but not acknowledged, all idle long
    enough for a loader to reclaim them (ROTA_LOADER_IDLE_RECLAIM_SECONDS)."""
    import redis

    from rota.buffer.streams import all_streams

    idle_ms = int(settings.loader_idle_reclaim_seconds * 1000) + 1
    client = redis.Redis.from_url(settings.redis_url)
    try:
        pending = idle = 0
        for stream in all_streams(settings.stream_prefix, settings.shards):
            if not client.exists(stream):
                continue
            group = settings.loader_group
            pending += len(client.xpending_range(stream, group, "-", "+", 10_000))
            idle += len(client.xpending_range(stream, group, "-", "+", 10_000, idle=idle_ms))
        return pending > 0 and idle == pending
    finally:
        client.close()
