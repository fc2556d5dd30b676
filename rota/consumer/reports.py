"""A worker's reports to the database, written as operations (rota.core) so
that they run on any connection and are tested without one.

Outcomes are reported in batches, a statement per kind. When the database
refuses a batch for its data, the tasks are reported one at a time, and a
task refused alone is dead with the reason: one task's bad row never holds
back the others' reports. A lost connection (`db.SERVER_LOST`) is never
caught here: it is an outage, and the caller reconnects.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from uuid import UUID

from rota import core
from rota.core import db
from rota.core.db import Op
from rota.core.results import (
    KeptResult,
    complete_keeping,
    complete_keeping_and_claim,
    wake_result_waiters,
)

log = logging.getLogger("rota.worker")

Token = tuple[UUID, int]  # (task id, attempt): the claim's fencing token
Item = TypeVar("Item")

# The longest error line, and the longest traceback, stored with a task.
MESSAGE_MAX = 4000
TRACEBACK_MAX = 64 * 1024


class ChildFailure(Exception):
    """A task's exception as its child process described it (process pool)."""

    def __init__(self, line: str, trace: str) -> None:
        super().__init__(line)
        self.line = line
        self.trace = trace


def describe(error: BaseException) -> str:
    """An exception as one stored line; never raises, whatever its __str__ does."""
    if isinstance(error, ChildFailure):
        return error.line
    try:
        text = "".join(traceback.format_exception_only(error)).strip()
    except Exception:
        text = f"{type(error).__name__} (its message could not be read)"
    return text[:MESSAGE_MAX]


def full_traceback(error: BaseException) -> str:
    """An exception's whole traceback, its end kept if too long; never raises."""
    if isinstance(error, ChildFailure):
        return error.trace or error.line
    try:
        text = "".join(traceback.format_exception(error))
    except Exception:
        text = describe(error)
    return text if len(text) <= TRACEBACK_MAX else "...\n" + text[-TRACEBACK_MAX:]


@dataclass
class Unreported:
    """Outcomes of finished tasks not yet stored. `report` empties a kind only
    once its statement went through, so that after a lost connection what is
    left is reported on the next one (fencing refuses any token whose lease
    went elsewhere meanwhile)."""

    done: list[Token] = field(default_factory=list)
    failed: list[core.Failure] = field(default_factory=list)
    stale: list[Token] = field(default_factory=list)  # not started: handed back
    unknown: list[Token] = field(default_factory=list)  # names the app does not know
    kept: list[KeptResult] = field(default_factory=list)  # completions with their results
    # The runs' measures of the completions in `done` and `kept`, by task id.
    runs: dict[UUID, core.RunTimes] = field(default_factory=dict)
    # Failed tasks that keep results: their waiters are woken if they end.
    waited: set[UUID] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.done or self.failed or self.stale or self.unknown or self.kept)


@dataclass(frozen=True)
class UnknownTaskPolicy:
    """ROTA_UNKNOWN_TASK_RETRY_SECONDS and _GRACE_SECONDS."""

    retry_seconds: float
    grace_seconds: float

    @property
    def reason(self) -> str:
        return (
            "unknown task: no worker whose app registers this name ran it within "
            f"ROTA_UNKNOWN_TASK_GRACE_SECONDS ({self.grace_seconds:g} s)"
        )


def report(
    unreported: Unreported,
    unknown: UnknownTaskPolicy,
    observe: Callable[[core.FailOutcome], None] | None = None,
    key: core.WorkerKey | None = None,
) -> Op[int]:
    """Reports every kind of outcome in turn, as the worker `key`; returns how
    many tasks finished (completed or failed, refused reports included).
    `observe` sees what became of each failure (retried, dead or cancelled)."""
    finished = 0
    if unreported.done:
        completed = yield from send(
            unreported.done, lambda tokens: core.complete(tokens, key, unreported.runs), _same, key
        )
        _note_refused(len(unreported.done), len(completed))
        finished += len(unreported.done)
        unreported.done = []
    if unreported.kept:
        kept = yield from send(
            unreported.kept,
            lambda items: complete_keeping(items, key, unreported.runs),
            _token_of_kept,
            key,
        )
        _note_refused(len(unreported.kept), len(kept))
        finished += len(unreported.kept)
        unreported.kept = []
    if not (unreported.done or unreported.kept):
        unreported.runs.clear()
    if unreported.failed:
        outcomes = yield from send(
            unreported.failed, lambda failures: core.fail(failures, key), _token_of_failure, key
        )
        ended = [o.id for o in outcomes if o.id in unreported.waited and o.status != "scheduled"]
        if ended:
            yield from wake_result_waiters(ended)
        unreported.waited.difference_update(f.task_id for f in unreported.failed)
        for outcome in outcomes:
            if observe is not None:
                observe(outcome)
            if outcome.status == "scheduled":
                log.info("task %s will be retried at %s", outcome.id, outcome.run_at)
            else:
                log.warning("task %s is %s", outcome.id, outcome.status)
        finished += len(unreported.failed)
        unreported.failed = []
    if unreported.stale:
        yield from send(unreported.stale, lambda tokens: core.release(tokens, key), _same, key)
        unreported.stale = []
    if unreported.unknown:

        def defer(tokens: list[Token]) -> Op[dict[UUID, str]]:
            return core.defer_unknown(
                tokens, unknown.retry_seconds, unknown.grace_seconds, unknown.reason, key
            )

        yield from send(unreported.unknown, defer, _same, key)
        unreported.unknown = []
    return finished


def completes_alone(unreported: Unreported) -> bool:
    """Whether completions (with or without results) are all there is to
    report (the steady state): then they can travel with the next claim
    (`complete_and_claim`)."""
    return bool(unreported.done or unreported.kept) and not (
        unreported.failed or unreported.stale or unreported.unknown
    )


def complete_and_claim(
    unreported: Unreported,
    queues: Sequence[str],
    limit: int,
    key: core.WorkerKey,
    lease_seconds: float,
) -> Op[tuple[int, list[core.ClaimedTask] | None]]:
    """Reports the completions and claims up to `limit`, in one statement
    (core.complete_and_claim); returns how many finished, and the tasks
    claimed (None: the claim is left to a statement of its own). A refusal
    of the statement leaves the completions unreported, for `report`."""
    tokens, kept, runs = unreported.done, unreported.kept, unreported.runs
    if kept:
        settled = yield from complete_keeping_and_claim(
            tokens, kept, queues, limit, key, lease_seconds, runs
        )
    else:
        settled = yield from core.complete_and_claim(
            tokens, queues, limit, key, lease_seconds, runs
        )
    unreported.done, unreported.kept, unreported.runs = [], [], {}
    _note_refused(len(tokens) + len(kept), settled.completed)
    return len(tokens) + len(kept), settled.claimed


def _note_refused(reported: int, completed: int) -> None:
    if reported > completed:
        log.warning(
            "%d completion(s) refused: lease lost, or reported before the connection was lost",
            reported - completed,
        )


def send(
    items: list[Item],
    op: Callable[[list[Item]], Op[Collection[Any]]],
    token_of: Callable[[Item], Token],
    key: core.WorkerKey | None = None,
) -> Op[list[Any]]:
    """Runs `op(items)`; if the database refuses it for its data, one item at
    a time, and an item refused alone is dead with the reason. Returns what
    the accepted statements returned."""
    try:
        return list((yield from op(items)))
    except db.SERVER_LOST:
        raise
    except Exception as exc:
        if len(items) == 1:
            yield from bury(token_of(items[0]), exc, key)
            return []
        log.warning("a report of %d tasks was refused (%s); one at a time", len(items), exc)
    results: list[Any] = []
    for item in items:
        try:
            results.extend((yield from op([item])))
        except db.SERVER_LOST:
            raise
        except Exception as exc:
            yield from bury(token_of(item), exc, key)
    return results


def bury(token: Token, error: Exception, key: core.WorkerKey | None = None) -> Op[None]:
    """A task whose report the database refuses: dead, with the reason."""
    task_id, attempt = token
    reason = f"its outcome could not be stored: {describe(error)}"
    log.error("task %s: %s", task_id, reason)
    try:
        yield from core.fail([core.Failure(task_id, attempt, reason, final=True)], key)
    except db.SERVER_LOST:
        raise
    except Exception as exc:
        # Left to its lease: when it expires the task is requeued, and dead
        # once out of attempts.
        log.error("task %s could not be marked dead either: %s", task_id, describe(exc))


def unreadable_claim(
    worker: str | core.WorkerKey, in_hand: Collection[UUID], error: Exception
) -> Op[int]:
    """A claim committed but its rows could not be read (a row the rules of
    today would refuse, stored before them). The tasks it took are this
    worker's claims not in hand: one alone is the culprit and is dead with
    the reason; several are handed back (no attempt used). Returns how many
    claims of one task to make next, to single the culprit out (0: none)."""
    taken = [t for t in (yield from core.worker_claims(worker)) if t.task_id not in in_hand]
    if len(taken) == 1:
        (culprit,) = taken
        reason = f"claimed, but could not be read: {describe(error)}"
        log.error("task %s: %s", culprit.task_id, reason)
        key = worker if isinstance(worker, core.WorkerKey) else None
        failure = core.Failure(culprit.task_id, culprit.attempt, reason, final=True)
        yield from core.fail([failure], key)
        return 0
    if taken:
        log.warning(
            "a claim of %d task(s) could not be read (%s); claiming one at a time",
            len(taken),
            describe(error),
        )
        yield from core.release(taken, worker if isinstance(worker, core.WorkerKey) else None)
    return len(taken)


def _same(token: Token) -> Token:
    return token


def _token_of_kept(kept: KeptResult) -> Token:
    return kept.token


def _token_of_failure(failure: core.Failure) -> Token:
    return (failure.task_id, failure.attempt)
