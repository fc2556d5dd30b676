"""Small helpers shared by the test tiers."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import psycopg

from rota import db, ops
from rota.envelope import TaskEnvelope, make_envelope


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
        )
        for i in range(count)
    ]


def load(conn: psycopg.Connection[Any], batch: Iterable[TaskEnvelope]) -> int:
    return db.transact(conn, ops.load(list(batch)))


def claim(
    conn: psycopg.Connection[Any],
    limit: int = 100,
    queues: tuple[str, ...] = ("default",),
    worker: str = "test-worker",
    lease_seconds: float = 60.0,
) -> list[ops.ClaimedTask]:
    return db.transact(conn, ops.claim(list(queues), limit, worker, lease_seconds))


def drain_order(conn: psycopg.Connection[Any], batch: int = 1) -> list[str]:
    """Claims and completes everything, one batch at a time; returns tenants in claim order."""
    order: list[str] = []
    while True:
        got = claim(conn, batch)
        if not got:
            return order
        order.extend(t.tenant for t in got)
        db.transact(conn, ops.complete(t.token for t in got))
