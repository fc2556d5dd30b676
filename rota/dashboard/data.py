"""What the console's pages and its HTTP API show and do, written once: each
function returns plain JSON-ready data (the API sends it as it is; a page
renders it) from the read model (rota.core.read, rota.readmodel.story,
rota.readmodel.figures), and each action goes through rota.core.admin,
audited with its actor. `Connections` is what they share: the servers, and
answers kept for a moment."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any
from uuid import UUID

import orjson
import psycopg
import redis

from rota import core
from rota.app import App
from rota.buffer import deadletters, redis_client
from rota.core import connections, db, history, read, taskpage, versions
from rota.core.progress import progress_of
from rota.core.results import task_result
from rota.errors import ValidationError
from rota.loader.replay import purge as purge_letters
from rota.loader.replay import replay as replay_letters
from rota.model.jsondata import plain
from rota.readmodel.figures import Figures, gather
from rota.readmodel.story import task_story
from rota.settings import Settings

POOL_SIZE = 4
MAX_ENQUEUE = 1000  # tasks per POST /api/tasks


class Connections:
    """A pool of a few connections to PostgreSQL (the console's threads share
    them: rota.core.connections.pool, which replaces one a restart or a dead
    link broke) and a Redis client."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # No connection yet: the console starts, and shows Redis's side,
        # while PostgreSQL is out.
        # A new connection waits for a schema the console runs on
        # (rota.core.versions): until then its pages say PostgreSQL is out.
        self._pool = connections.pool(settings, "console", size=POOL_SIZE, configure=versions.ready)
        self._redis: redis_client.Client | None = None
        self._producer: App | None = None
        self._lock = threading.Lock()
        # Half of ROTA_STATS_SECONDS, how often what the pages show is counted.
        self.recent = Recent(settings.stats_seconds / 2)

    def postgres(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """One of the pool's connections, for the length of a `with`."""
        return self._pool.connection()

    def producer(self) -> App:
        """An App for POST /api/tasks: the SDK's checks, buffer and fallback."""
        with self._lock:
            if self._producer is None:
                self._producer = App(self.settings)
            return self._producer

    @property
    def redis(self) -> redis_client.Client:
        """Made on first use: the console starts, and shows PostgreSQL's side,
        while Redis is out."""
        with self._lock:
            if self._redis is None:
                self._redis = redis_client.connect(self.settings)
            return self._redis

    def close(self) -> None:
        self._pool.close()
        if self._redis is not None:
            self._redis.close()
        if self._producer is not None:
            self._producer.close()


class Recent:
    """Answers kept for a moment, so that many browsers refreshing the same
    pages (and Prometheus scraping) cost the database one read per moment:
    the figures they show are counted by maintenance every ROTA_STATS_SECONDS
    anyway."""

    def __init__(self, seconds: float, size: int = 64) -> None:
        self.seconds, self.size = seconds, size
        self._kept: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        """After an action: what it changed shows at once."""
        with self._lock:
            self._kept.clear()

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        now = time.monotonic()
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and now - kept[0] < self.seconds:
                return kept[1]
        value = make()
        with self._lock:
            if len(self._kept) >= self.size:
                self._kept.clear()
            self._kept[key] = (time.monotonic(), value)
        return value


def figures(c: Connections, top_tenants: int = 10) -> Figures:
    """The overview (rota.readmodel.figures) over the console's connections,
    kept for a moment (`Recent`)."""

    def fetch() -> Figures:
        return gather(c.settings, top_tenants, c.postgres, lambda: contextlib.nullcontext(c.redis))

    found: Figures = c.recent.get(("figures", top_tenants), fetch)
    return found


def overview(c: Connections, top_tenants: int = 10) -> dict[str, Any]:
    data: dict[str, Any] = plain(figures(c, top_tenants))
    return data


def tenants(
    c: Connections, sort: str, descending: bool, prefix: str, page: int, per_page: int
) -> dict[str, Any]:
    if type(page) is not int or page < 1:
        raise ValidationError("page must be a whole number from 1")
    listing = read.tenants(
        sort=sort,
        descending=descending,
        prefix=prefix,
        offset=(page - 1) * per_page,
        limit=per_page,
    )

    def fetch() -> read.TenantPage:
        with c.postgres() as conn:
            return db.run(conn, listing)

    found: read.TenantPage = c.recent.get(
        ("tenants", sort, descending, prefix, page, per_page), fetch
    )
    pages = max(1, -(-found.total // per_page))
    return {
        "total": found.total,
        "page": page,
        "pages": pages,
        "per_page": per_page,
        "sort": sort,
        "descending": descending,
        "prefix": prefix,
        "fair_minutes": history.FAIR_MINUTES,  # the window of each row's figures per minute
        "tenants": plain(found.rows),
    }


def tenant(c: Connections, name: str) -> dict[str, Any] | None:
    detail = read.tenant(name)
    with c.postgres() as conn:
        found = db.run(conn, detail)
        if found is None:
            return None
        dead = db.run(conn, read.tasks("dead", tenant=name, limit=10))
    return {"tenant": plain(found), "dead": plain(dead)}


def tasks(
    c: Connections,
    state: str,
    tenant: str | None,
    queue_name: str | None,
    page: int,
    per_page: int,
) -> dict[str, Any]:
    """A page of a state's tasks, and how many the filter has (counted up to
    taskpage.TASKS_COUNTED, which pages reach)."""
    if type(page) is not int or page < 1:
        raise ValidationError("page must be a whole number from 1")
    listing = taskpage.task_page(
        state, tenant=tenant, queue=queue_name, offset=(page - 1) * per_page, limit=per_page
    )
    with c.postgres() as conn:
        found = db.run(conn, listing)
        # Running tasks show how far they got.
        reported = (
            db.run(conn, progress_of([r.id for r in found.rows])) if state == "running" else {}
        )
    rows = plain(found.rows)
    if state == "running":
        for row, task in zip(rows, found.rows, strict=True):
            row["progress"] = plain(reported.get(task.id))
    return {
        "state": state,
        "tenant": tenant,
        "queue": queue_name,
        "total": found.total,
        "more": found.more,
        "page": page,
        "pages": max(1, -(-found.total // per_page)),
        "per_page": per_page,
        "tasks": rows,
    }


def task_id(value: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise ValidationError(f"{value[:60]!r} is not a task id (a UUID)") from None


def story(c: Connections, task: UUID) -> dict[str, Any]:
    client: redis_client.Client | None
    try:
        client = c.redis
        client.ping()
    except (redis.RedisError, OSError):
        client = None
    with c.postgres() as conn:
        found = task_story(conn, client, c.settings, task)
    data: dict[str, Any] = plain(found)
    data["result"] = result(c, task)
    return data


def result(c: Connections, task: UUID) -> dict[str, Any] | None:
    """A task's result as a waiter would get it (GET /api/tasks/ID/result);
    None when PostgreSQL has no trace of the task."""
    with c.postgres() as conn:
        state = db.run(conn, task_result(task))
    if state is None:
        return None
    expired = state.kept and state.value is None and state.refused is None
    return {
        "id": str(task),
        "status": "waiting" if state.status == "pending" else state.status,
        "kept": state.kept,
        "value": orjson.loads(state.value) if state.value is not None else None,
        "refused": state.refused,
        "expired": expired and state.status == "succeeded",
        "expires_at": state.expires_at.isoformat() if state.expires_at else None,
        "error": state.error,
    }


def workers(c: Connections) -> dict[str, Any]:
    with c.postgres() as conn:
        rows = db.run(conn, read.workers())
    return {"workers": plain(rows)}


def key_limits(c: Connections) -> dict[str, Any]:
    """The limits on keys with their keys' counters (as `rota limit list`)."""
    with c.postgres() as conn:
        rows = db.run(conn, core.limits())
    return {"key_limits": [row._asdict() for row in rows]}


def audit(c: Connections, limit: int = 50) -> dict[str, Any]:
    listing = read.audit(limit)
    with c.postgres() as conn:
        rows = db.run(conn, listing)
    return {"audit": plain(rows)}


def dead_letters(c: Connections, before: str | None, limit: int = 50) -> dict[str, Any]:
    prefix = c.settings.stream_prefix
    letters = deadletters.newest(c.redis, prefix, limit, before)
    return {"total": deadletters.count(c.redis, prefix), "letters": plain(letters)}


# -- actions -----------------------------------------------------------------


def cancel(c: Connections, ids: list[UUID], actor: str) -> dict[str, Any]:
    op = core.cancel(ids, actor)
    with c.postgres() as conn:
        outcomes = db.run(conn, op)
    return {"outcomes": {str(i): outcomes.get(i, "unknown") for i in ids}}


def retry(c: Connections, ids: list[UUID], actor: str) -> dict[str, Any]:
    op = core.retry(ids, actor)
    with c.postgres() as conn:
        retried = db.run(conn, op)
    return {"retried": sorted(str(i) for i in retried)}


def retry_dead(
    c: Connections, actor: str, tenant: str | None, queue_name: str | None
) -> dict[str, Any]:
    op = core.retry_dead(actor, tenant=tenant, queue=queue_name)
    with c.postgres() as conn:
        return {"retried": db.run(conn, op)}


def pause(c: Connections, kind: str, name: str, paused: bool, actor: str) -> dict[str, Any]:
    op = (core.pause_queue if kind == "queue" else core.pause_tenant)(name, paused, actor)
    with c.postgres() as conn:
        found = db.run(conn, op)
    return {"found": found, kind: name, "paused": paused}


def patch_tenant(c: Connections, name: str, changes: dict[str, Any], actor: str) -> dict[str, Any]:
    op = core.patch_tenant(name, changes, actor)
    with c.postgres() as conn:
        slot = db.run(conn, op)
    return {"tenant": name, "slot": slot, "changed": changes}


def replay(c: Connections, letter_ids: list[str], actor: str) -> dict[str, Any]:
    with c.postgres() as conn:
        result = replay_letters(c.redis, conn, c.settings, letter_ids, actor)
    data: dict[str, Any] = plain(result)
    return data


def purge(c: Connections, letter_ids: list[str], everything: bool, actor: str) -> dict[str, Any]:
    with c.postgres() as conn:
        removed = purge_letters(
            c.redis, conn, c.settings.stream_prefix, actor, letter_ids, everything
        )
    return {"purged": removed}


ENQUEUE_FIELDS = {
    "name",
    "tenant",
    "queue",
    "args",
    "kwargs",
    "eta",
    "countdown",
    "cost",
    "idempotency_key",
    "priority",
}


def enqueue(c: Connections, body: Any) -> dict[str, Any]:
    """POST /api/tasks: one task (an object) or many (a list), checked and
    stored as the SDK does (buffer, or PostgreSQL when Redis cannot)."""
    items = body if isinstance(body, list) else [body]
    if not items or len(items) > MAX_ENQUEUE:
        raise ValidationError(f"send 1 to {MAX_ENQUEUE} tasks")
    producer = c.producer()
    calls = []
    for n, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValidationError(f"task {n}: a JSON object is expected")
        unknown = set(item) - ENQUEUE_FIELDS
        if unknown:
            raise ValidationError(f"task {n}: unknown fields {sorted(unknown)}")
        for needed in ("name", "tenant", "queue"):
            if needed not in item:
                raise ValidationError(f"task {n}: {needed!r} is required")
        eta_text, eta = item.get("eta"), None
        if eta_text is not None:
            if not isinstance(eta_text, str):
                raise ValidationError(f"task {n}: eta is an ISO 8601 time with its zone")
            try:
                eta = datetime.fromisoformat(eta_text)
            except ValueError:
                bad = eta_text[:40]
                raise ValidationError(f"task {n}: eta {bad!r} is not an ISO 8601 time") from None
        calls.append(
            producer.prepare(
                item["name"],
                item.get("args", []),
                item.get("kwargs") or {},
                tenant=item["tenant"],
                queue=item["queue"],
                eta=eta,
                countdown=item.get("countdown"),
                cost=item.get("cost"),
                idempotency_key=item.get("idempotency_key"),
                priority=item.get("priority"),
            )
        )
    ids = producer.enqueue_many(calls)
    return {"ids": [str(i) for i in ids]}
