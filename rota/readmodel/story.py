"""A task's story, wherever it is, and why it waits, in plain words.

Looked for in PostgreSQL first (rota.core.stored.stored_task), then in the
Redis buffer (found by the time in its UUIDv7 id, or by a bounded scan), then
in the dead-letter stream. Shared by `rota task show`, the console and its
HTTP API.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import psycopg
import redis

from rota.buffer import deadletters
from rota.buffer.redis_client import Client
from rota.buffer.streams import all_streams, oldest_age
from rota.core import db
from rota.core.progress import task_progress
from rota.core.stored import AHEAD_CAP, StoredTask, stored_task
from rota.model.progress import Progress
from rota.settings import Settings

# Around the time in a UUIDv7 id, the window of stream entries searched: a
# task is written to the buffer within moments of its id being minted.
WINDOW_MS = 120_000
# Entries scanned per shard for an id without a time (an idempotency key's).
SCAN_MAX = 10_000


@dataclass(frozen=True)
class InBuffer:
    stream: str
    entry: str
    entries_ahead: int  # in its shard, not yet loaded
    oldest_age_seconds: float  # of its shard's oldest entry: the loaders' lag
    deliveries: int  # times a loader read it without loading it (0: not read yet)


@dataclass(frozen=True)
class Story:
    id: UUID
    where: (
        str  # buffer, scheduled, ready, running, succeeded, dead, cancelled, dead-letter, unknown
    )
    why: str  # one answer, with the numbers
    task: StoredTask | None = None
    buffer: InBuffer | None = None
    dead_letter: deadletters.DeadLetter | None = None
    progress: Progress | None = None  # the last it reported (rota.context().progress)


def _uuid7_ms(task_id: UUID) -> int | None:
    return task_id.int >> 80 if task_id.version == 7 else None


def find_in_buffer(client: Client, settings: Settings, task_id: UUID) -> InBuffer | None:
    needle = str(task_id).encode()
    minted = _uuid7_ms(task_id)
    for stream in all_streams(settings.stream_prefix, settings.shards):
        if minted is not None:
            window: Any = client.xrange(
                stream, min=str(max(0, minted - WINDOW_MS)), max=str(minted + WINDOW_MS)
            )
        else:
            window = client.xrange(stream, count=SCAN_MAX)
        for entry_id, fields in window:
            if needle in fields.get(b"tasks", b""):
                return _place(client, settings, stream, entry_id.decode())
    return None


def _place(client: Client, settings: Settings, stream: str, entry: str) -> InBuffer:
    ahead: Any = client.xrange(stream, min="-", max=f"({entry}", count=AHEAD_CAP + 1)
    first: Any = client.xrange(stream, count=1)
    age = oldest_age(entry_id for entry_id, _ in first)
    try:
        pending: Any = client.xpending_range(
            stream, settings.loader_group, min=entry, max=entry, count=1
        )
    except redis.ResponseError:  # no consumer group yet: no loader ever ran
        pending = []
    deliveries = next((int(p["times_delivered"]) for p in pending), 0)
    return InBuffer(stream, entry, len(ahead), round(age, 3), deliveries)


def task_story(
    conn: psycopg.Connection[Any], client: Client | None, settings: Settings, task_id: UUID
) -> Story:
    """The task's story; `client` None skips the buffer (Redis unreachable)."""
    stored = db.run(conn, stored_task(task_id))
    if stored is not None:
        progress = db.run(conn, task_progress(task_id))
        return Story(task_id, _where(stored), why(stored), task=stored, progress=progress)
    if client is not None:
        place = find_in_buffer(client, settings, task_id)
        if place is not None:
            return Story(task_id, "buffer", why_in_buffer(place), buffer=place)
        letter = deadletters.find_task(client, settings.stream_prefix, str(task_id))
        if letter is not None:
            return Story(
                task_id,
                "dead-letter",
                f"the loader could not load it and put it in the dead-letter stream "
                f"({letter.id}): {letter.reason}",
                dead_letter=letter,
            )
    searched = "PostgreSQL, the buffer or its dead letters" if client else "PostgreSQL"
    return Story(task_id, "unknown", f"no task with this id in {searched}")


def _where(task: StoredTask) -> str:
    if task.worker is not None:
        return "running"
    if task.status == "pending":
        return "ready"
    return task.status


def _seconds(value: float) -> str:
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _about(value: int) -> str:
    """An estimate to two significant figures: 643,211 -> 640,000."""
    return f"{round(value, 2 - len(str(value))):,}"


def _since(at: datetime, now: datetime) -> str:
    return _seconds(max(0.0, (now - at).total_seconds()))


def why_in_buffer(place: InBuffer) -> str:
    ahead = (
        f"{place.entries_ahead:,}" if place.entries_ahead <= AHEAD_CAP else f"over {AHEAD_CAP:,}"
    )
    text = (
        f"still in the Redis buffer ({place.stream}), not yet loaded into PostgreSQL: "
        f"{ahead} entries ahead of it in its shard; the shard's oldest entry is "
        f"{_seconds(place.oldest_age_seconds)} old"
    )
    if place.deliveries:
        text += f"; a loader has read it {place.deliveries} time(s) without loading it"
    elif place.oldest_age_seconds > 10:
        text += " (is a loader running?)"
    return text


def why(task: StoredTask, now: datetime | None = None) -> str:
    """Why a stored task is where it is, in one answer with the numbers."""
    now = now or datetime.now(UTC)
    allowed = "?" if task.max_attempts is None else task.max_attempts
    attempt = f"attempt {task.attempts} of {allowed}"
    if task.status == "succeeded":
        ran = ""
        if task.started_at is not None and task.finished_at is not None:
            ran = f", ran {_seconds((task.finished_at - task.started_at).total_seconds())}"
        when = task.finished_at or now
        return f"succeeded {_since(when, now)} ago after {task.attempts} attempt(s){ran}"
    if task.status == "dead":
        return f"dead after {attempt}: {task.last_error or 'no error recorded'}"
    if task.status == "cancelled":
        return f"cancelled {_since(task.finished_at or now, now)} ago ({task.last_error})"
    if task.worker is not None:
        lease = task.lease_expires_at
        text = (
            f"running on worker {task.worker} for {_since(task.claimed_at or now, now)} "
            f"(attempt {task.attempt} of {allowed}); its lease runs until "
            f"{lease.isoformat() if lease else '?'}"
        )
        if task.cancel_requested:
            text += "; cancelled: it will not be retried"
        return text
    graph = task.graph
    if task.status == "scheduled" and graph is not None and graph.waiting:
        return (
            f"a join of a workflow: waits for {graph.waiting} of its {graph.members} "
            "member(s) to succeed (it holds no place in line meanwhile)"
        )
    if task.status == "scheduled":
        run_at = task.run_at or now
        wait = max(0.0, (run_at - now).total_seconds())
        if task.attempts and task.last_error:
            reason = f"its retry backoff after {attempt} failed ({task.last_error})"
        elif task.eta is not None:
            reason = "its ETA"
        else:
            reason = "its turn to be promoted"
        due = f"in {_seconds(wait)}" if wait > 0 else "now (maintenance promotes it shortly)"
        return f"scheduled: waits for {reason}; it is due {due}"
    if task.parked:
        return _why_parked(task)
    return _why_ready(task)


def _why_parked(task: StoredTask) -> str:
    """A task set aside while its key had no room (rota.parked)."""
    held = []
    if task.key_concurrency is not None:
        held.append(f"{task.key_running or 0} running of {task.key_concurrency}")
    if task.key_rate is not None and task.key_tokens is not None:
        held.append(
            f"{task.key_rate:g} starts/s"
            + (
                f", the next in {_seconds((1 - task.key_tokens) / task.key_rate)}"
                if task.key_tokens < 1
                else ""
            )
        )
    numbers = f" ({'; '.join(held)})" if held else ""
    return (
        f"waiting for room under key {task.limit_key}{numbers}: set aside out of line, it "
        "goes back to its place when a task of the key ends (rota limit list shows the limits)"
    )


def _why_ready(task: StoredTask) -> str:
    held: list[str] = []
    if task.queue_paused:
        held.append(f"its queue {task.queue} is paused")
    if task.tenant_paused:
        held.append(f"its tenant {task.tenant} is paused")
    limit = task.concurrency_limit
    if limit is not None and task.tenant_running >= limit:
        held.append(
            f"tenant {task.tenant} is at its concurrency limit: "
            f"{task.tenant_running} running of {limit}"
        )
    if task.rate_limit is not None and task.tokens is not None and task.tokens < 1:
        wait = (1 - task.tokens) / task.rate_limit
        held.append(
            f"tenant {task.tenant} is out of rate tokens ({task.rate_limit:g}/s): "
            f"the next comes in {_seconds(wait)}"
        )
    if task.queue_workers == 0:
        held.append(f"no live worker claims queue {task.queue}")
    if task.ahead is None:
        place = "in line"
    elif task.ahead_estimated:
        place = (
            f"in line, with about {_about(task.ahead)} claimable tasks ahead of it "
            f"(over {AHEAD_CAP:,} counted; the rest estimated from a sample)"
        )
    else:
        place = f"in line, with {task.ahead:,} claimable tasks ahead of it"
    text = f"ready: {place} in queue {task.queue} (fair order)"
    if task.priority > 0 and task.lower_ahead:
        turn = (
            "its tenant's next turn"
            if not task.urgent_before
            else f"the turn of its tenant after its {task.urgent_before:,} more urgent task(s)"
        )
        lower = f"{task.lower_ahead:,}" if task.lower_ahead <= AHEAD_CAP else f"over {AHEAD_CAP:,}"
        text = (
            f"ready, priority {task.priority}: runs at {turn}, ahead of {lower} "
            f"lower-priority task(s) of tenant {task.tenant}; that turn is {place} "
            f"in queue {task.queue} (fair order)"
        )
    if held:
        text += "; held back: " + "; ".join(held)
    elif task.queue_workers:
        text += f"; {task.queue_workers} live worker(s) claim this queue"
    return text
