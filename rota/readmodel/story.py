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
from rota.buffer.streams import ENTRY_MAX_TASKS, all_streams, oldest_age
from rota.core import db
from rota.core.read import QueuePace, queue_pace
from rota.core.stored import AHEAD_CAP, StoredTask, stored_task
from rota.settings import Settings

# Around the time in a UUIDv7 id, the window of stream entries searched: a
# task is written to the buffer within moments of its id being minted.
WINDOW_MS = 120_000
# Entries scanned per shard for an id without a time (an idempotency key's).
SCAN_MAX = 10_000
# A ready task's start is estimated from its queue's completions over this
# many recent minutes (rota.service), which maintenance counts every
# ROTA_STATS_SECONDS: a count older than COUNT_STALE_SECONDS gives none.
PACE_MINUTES = 5
COUNT_STALE_SECONDS = 120.0


@dataclass(frozen=True)
class StartEstimate:
    """When a ready task should start: its place in line at its queue's
    recent completion rate. An estimate: the rate and the line change."""

    tasks_ahead: int
    per_minute: float  # the queue's completions per minute, last PACE_MINUTES
    minutes: int  # PACE_MINUTES
    seconds: float | None  # None: no estimate (`why_not` says why)
    why_not: str | None = None


@dataclass(frozen=True)
class InBuffer:
    stream: str
    entry: str
    entries_ahead: int  # in its shard, not yet loaded
    oldest_age_seconds: float  # of its shard's oldest entry: the loaders' lag
    deliveries: int  # times a loader read it without loading it (0: not read yet)


@dataclass(frozen=True)
class RunWords:
    """A claimed or succeeded task's (last) run in words: when it was
    claimed, when it started, how long it ran."""

    claimed_at: str
    started_at: str
    ran: str


@dataclass(frozen=True)
class Story:
    id: UUID
    # buffer, scheduled, ready, running, claimed (not started: prefetched),
    # succeeded, dead, cancelled, dead-letter, unknown
    where: str
    why: str  # one answer, with the numbers
    task: StoredTask | None = None
    buffer: InBuffer | None = None
    dead_letter: deadletters.DeadLetter | None = None
    start: StartEstimate | None = None  # ready, in line: when it should start
    run: RunWords | None = None  # a claimed or succeeded task's run


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
        now = datetime.now(UTC)
        start = None
        if _where(stored) == "ready" and not stored.parked and stored.ahead is not None:
            start = estimate(stored, db.run(conn, queue_pace(stored.queue, PACE_MINUTES)))
        text = why(stored, now)
        if start is not None:
            text += "; " + said(start, stored.ahead_estimated)
        run = run_words(stored, now)
        return Story(task_id, _where(stored), text, task=stored, start=start, run=run)
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
        return "running" if task.claim_running else "claimed"
    if task.status == "pending":
        return "ready"
    return task.status


def _seconds(value: float) -> str:
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _roughly(value: float) -> str:
    """A duration to the second under two minutes, as `_seconds` past that."""
    return f"{value:.0f} s" if value < 120 else _seconds(value)


def _about(value: int) -> str:
    """An estimate to two significant figures: 643,211 -> 640,000."""
    return f"{round(value, 2 - len(str(value))):,}"


def _since(at: datetime, now: datetime) -> str:
    return _seconds(max(0.0, (now - at).total_seconds()))


def ran_for(seconds: float) -> str:
    """A run's measured seconds, short ones to two significant figures
    (a 50 ms task ran 0.05 s)."""
    return f"{seconds:.2g} s" if seconds < 1 else _seconds(seconds)


def _at(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds")


def run_words(task: StoredTask, now: datetime) -> RunWords | None:
    """The run of a claimed or succeeded task (None for others). A
    succeeded task's record without its claim's time predates keeping runs'
    starts: its started_at is its claim's time, and is shown as such."""
    if task.status == "succeeded":
        if task.started_at is None:
            return None
        if task.claimed_at is None or (
            task.ran_seconds is None and task.started_at == task.claimed_at
        ):
            claimed = _at(task.claimed_at or task.started_at)
            return RunWords(claimed, f"not recorded (claimed at {claimed})", "not recorded")
        ran = "not recorded" if task.ran_seconds is None else ran_for(task.ran_seconds)
        return RunWords(_at(task.claimed_at), _at(task.started_at), ran)
    if task.worker is None or task.claimed_at is None:
        return None
    if not task.claim_running:
        return RunWords(_at(task.claimed_at), "not started (prefetched)", "-")
    if task.started_at is None:
        return RunWords(_at(task.claimed_at), "not yet told (its heartbeat tells it)", "-")
    return RunWords(
        _at(task.claimed_at), _at(task.started_at), f"{_since(task.started_at, now)} so far"
    )


def why_in_buffer(place: InBuffer) -> str:
    ahead = (
        f"{place.entries_ahead:,}" if place.entries_ahead <= AHEAD_CAP else f"over {AHEAD_CAP:,}"
    )
    tasks = place.entries_ahead * ENTRY_MAX_TASKS
    up_to = (
        f"up to {tasks:,}"
        if place.entries_ahead <= AHEAD_CAP
        else f"over {AHEAD_CAP * ENTRY_MAX_TASKS:,}"
    )
    text = (
        f"still in the Redis buffer ({place.stream}), not yet loaded into PostgreSQL: "
        f"{ahead} entries ahead of it in its shard ({up_to} tasks: an entry holds up to "
        f"{ENTRY_MAX_TASKS}); the shard's oldest entry is "
        f"{_seconds(place.oldest_age_seconds)} old"
    )
    if place.deliveries:
        text += f"; a loader has read it {place.deliveries} time(s) without loading it"
    elif place.oldest_age_seconds > 10:
        text += " (is a loader running?)"
    return text + "; no estimate of when it starts until it is loaded and has a place in line"


def estimate(task: StoredTask, pace: QueuePace | None) -> StartEstimate:
    """When a ready task in line should start: the tasks ahead of it at its
    queue's recent completion rate; none while it is held back, or when
    nothing completed recently (or completions are not being counted)."""
    ahead = task.ahead or 0
    per_minute = pace.per_minute if pace is not None else 0.0

    def none(why_not: str) -> StartEstimate:
        return StartEstimate(ahead, per_minute, PACE_MINUTES, None, why_not)

    if _held_back(task):
        return none("it is held back")
    if pace is None:
        return none("completions were never counted (is maintenance running?)")
    if pace.counted_seconds_ago > COUNT_STALE_SECONDS:
        return none(
            f"completions were last counted {_seconds(pace.counted_seconds_ago)} ago "
            "(is maintenance running?)"
        )
    if pace.completed == 0:
        return none(f"nothing in queue {task.queue} completed in the last {PACE_MINUTES} minutes")
    return StartEstimate(ahead, per_minute, PACE_MINUTES, ahead * 60 / per_minute)


def _held_back(task: StoredTask) -> bool:
    """Whether anything of `_why_ready`'s "held back" holds the task."""
    limit = task.concurrency_limit
    return bool(
        task.queue_paused
        or task.tenant_paused
        or (limit is not None and task.tenant_running >= limit)
        or (task.rate_limit is not None and task.tokens is not None and task.tokens < 1)
        or task.queue_workers == 0
    )


def said(start: StartEstimate, ahead_estimated: bool = False) -> str:
    """The estimate in words, with what it is made of."""
    per_minute = start.per_minute
    rate = f"{per_minute:,.0f}/min" if per_minute >= 100 else f"{per_minute:.3g}/min"
    if start.seconds is None:
        return f"no estimate of when it starts: {start.why_not}"
    pace = f"at its queue's last-{start.minutes}-minutes rate of {rate}"
    if start.tasks_ahead == 0:
        return f"estimated start: it is next in line ({pace})"
    when = "under a second" if start.seconds < 1 else "about " + _roughly(start.seconds)
    ahead = f"{'about ' if ahead_estimated else ''}{start.tasks_ahead:,} tasks ahead"
    return f"estimated start: in {when} ({ahead}, {pace})"


def why(task: StoredTask, now: datetime | None = None) -> str:
    """Why a stored task is where it is, in one answer with the numbers."""
    now = now or datetime.now(UTC)
    allowed = "?" if task.max_attempts is None else task.max_attempts
    attempt = f"attempt {task.attempts} of {allowed}"
    if task.status == "succeeded":
        when = task.finished_at or now
        text = f"succeeded {_since(when, now)} ago after {task.attempts} attempt(s)"
        run = run_words(task, now)
        if run is not None:
            text += f"; claimed at {run.claimed_at}, started at {run.started_at}, ran {run.ran}"
        return text
    if task.status == "dead":
        return f"dead after {attempt}: {task.last_error or 'no error recorded'}"
    if task.status == "cancelled":
        return f"cancelled {_since(task.finished_at or now, now)} ago ({task.last_error})"
    if task.worker is not None:
        lease = task.lease_expires_at
        claimed = task.claimed_at or now
        if not task.claim_running:
            text = (
                f"claimed by worker {task.worker}, waiting for a free slot (prefetched) for "
                f"{_since(claimed, now)} (attempt {task.attempt} of {allowed}); its lease runs "
                f"until {lease.isoformat() if lease else '?'}"
            )
        else:
            started = (
                f"{_at(task.started_at)} ({_since(task.started_at, now)})"
                if task.started_at is not None
                else f"about {_at(claimed)}, its claim ({_since(claimed, now)}; its heartbeat "
                "has not yet told its start)"
            )
            text = (
                f"running on worker {task.worker} since {started} "
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
        held.append(f"{task.key_running or 0} claimed of {task.key_concurrency}")
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
            f"{task.tenant_running} claimed of {limit} (running or prefetched)"
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
