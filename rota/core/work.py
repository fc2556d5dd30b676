"""Workers: claim in fair order, report outcomes, hold leases."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

import orjson

from rota.core.arrays import Float8Array, Int4Array
from rota.core.db import Execute, Op, UUIDArray, select, value, values
from rota.core.rows import Row, Rows
from rota.errors import ValidationError
from rota.model.rules import check_queue
from rota.runtime.redact import redact
from rota.sql import query


class ClaimedTask(NamedTuple):
    """A claimed task (a tuple: built 100 at a time on the claim's hot path)."""

    id: UUID
    name: str
    payload: dict[str, Any]
    queue: str
    tenant: str
    attempt: int
    max_attempts: int
    lease_expires_at: datetime
    enqueued_at: datetime

    @property
    def args(self) -> list[Any]:
        return list(self.payload.get("args", []))

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.payload.get("kwargs", {}))

    @property
    def token(self) -> tuple[UUID, int]:
        """The fencing token that completes, fails or extends this claim."""
        return (self.id, self.attempt)


# A run as its worker measured it on its monotonic clock: the seconds from
# when its claim was sent to its start, and the seconds it ran. The database
# adds the first to the claim's time (no clock skew between them): the start
# it records is at most a round trip late. A plain tuple: one is made per
# task on the worker's hot path.
RunTimes = tuple[float, float]


@dataclass(frozen=True)
class Failure:
    """A failed attempt: `error` is its one line, `traceback` the whole of it;
    `retry_at` forces the next attempt's time (rota.Retry); `final` ends the
    task at once (no retry can help, e.g. an unknown task)."""

    task_id: UUID
    attempt: int
    error: str
    retry_at: datetime | None = None
    final: bool = False
    traceback: str | None = None


@dataclass(frozen=True)
class FailOutcome:
    id: UUID
    status: str  # 'scheduled' (will retry) or 'dead'
    run_at: datetime | None


def claim(
    queues: Sequence[str], limit: int, worker: str | WorkerKey, lease_seconds: float = 60.0
) -> Op[list[ClaimedTask]]:
    """Claims up to `limit` ready tasks of `queues` in fair order (SKIP LOCKED)
    for `worker` (its id, or its key: see WorkerKey)."""
    claiming = query("claim"), query("worker_claim")
    statement, params = _claiming(*claiming, queues, limit, worker, lease_seconds)
    claimed = yield from select(statement, params, _CLAIMED)
    return claimed


class Settled(NamedTuple):
    """What `complete_and_claim` did: how many of the tokens completed (a
    stale one is refused), and the tasks claimed (None: the claim was left to
    a statement of its own, `claim`)."""

    completed: int
    claimed: list[ClaimedTask] | None


def complete_and_claim(
    tokens: Iterable[tuple[UUID, int]],
    queues: Sequence[str],
    limit: int,
    worker: str | WorkerKey,
    lease_seconds: float = 60.0,
    runs: Mapping[UUID, RunTimes] | None = None,
) -> Op[Settled]:
    """Completes claimed tasks (as `complete`), then claims up to `limit` (as
    `claim`), in one statement: one round trip and one transaction. When a
    completion had to lock a limited tenant's row, nothing is claimed
    (`claimed` is None; rota.complete_claim says why): the caller claims in a
    statement of its own."""
    claiming = query("complete_claim"), query("worker_complete_claim")
    reports = completion_params(tokens, runs)
    return settle_and_claim(claiming, reports, queues, limit, worker, lease_seconds)


def settle_and_claim(
    statements: tuple[str, str],
    reports: dict[str, Any],
    queues: Sequence[str],
    limit: int,
    worker: str | WorkerKey,
    lease_seconds: float,
) -> Op[Settled]:
    """Runs a statement that reports (`reports`: its parameters) and then
    claims (the plain one, or the worker's), in one round trip."""
    statement, params = _claiming(*statements, queues, limit, worker, lease_seconds)
    settled = yield Execute(statement, {**params, **reports}, _SETTLED)
    (((completed, claimed_too), claimed),) = settled
    return Settled(completed, claimed if claimed_too else None)


def _claiming(
    plain: str,
    as_worker: str,
    queues: Sequence[str],
    limit: int,
    worker: str | WorkerKey,
    lease: float,
) -> tuple[str, dict[str, Any]]:
    """A claiming statement (`as_worker` for a worker's key) and its parameters."""
    for queue in queues:
        check_queue(queue)
    if limit < 1:
        raise ValidationError(f"claim limit must be >= 1, got {limit}")
    params = {"queues": list(queues), "limit": limit, "lease_seconds": lease}
    if isinstance(worker, WorkerKey):
        return as_worker, _keyed(worker, params)
    return plain, {**params, "worker": worker}


# The payload comes as text: orjson parses it several times faster than
# psycopg's default json loader.
_CLAIMED = Rows(ClaimedTask, payload=orjson.loads)


class _Settlement:
    """rota.complete_claim's rows: the first is the outcome (completed,
    claimed), the others are the tasks claimed."""

    def build(self, columns: Sequence[str], rows: list[Row]) -> list[Any]:
        head = rows[0]
        outcome = (head[columns.index("completed")], head[columns.index("claimed")])
        tasks = _CLAIMED.read(columns, rows[1:], _OUTCOME_COLUMNS)
        return [(outcome, tasks)]


_OUTCOME_COLUMNS = frozenset({"completed", "claimed"})
_SETTLED = _Settlement()


@dataclass(frozen=True)
class WorkerKey:
    """A registered worker and the secret it registered with. A worker's
    claims and reports carry it, and the database (rota.check_worker) lets a
    worker role claim and report only as, and for, the worker it registered;
    without it (an owner's or admin's connection) they act on any task."""

    id: str
    secret: bytes

    @classmethod
    def new(cls, worker_id: str) -> WorkerKey:
        return cls(worker_id, secrets.token_bytes(32))

    def __repr__(self) -> str:
        return f"WorkerKey({self.id!r}, secret=***)"


def _as(
    key: WorkerKey | None, plain: str, as_worker: str, params: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The statement `as_worker` with the worker's id and secret, when `key`
    is given (it checks them first); else `plain`."""
    if key is None:
        return plain, params
    return as_worker, _keyed(key, params)


def _keyed(key: WorkerKey, params: dict[str, Any]) -> dict[str, Any]:
    return {**params, "worker": key.id, "secret": key.secret}


def token_params(tokens: Iterable[tuple[UUID, int]]) -> dict[str, list[Any]]:
    ids, attempts = UUIDArray(), Int4Array()
    for task_id, attempt in tokens:
        ids.append(task_id)
        attempts.append(attempt)
    return {"ids": ids, "attempts": attempts}


def run_params(ids: Sequence[UUID], runs: Mapping[UUID, RunTimes] | None) -> dict[str, Any]:
    """The runs' measures of these tasks, in their order (NULL: not told):
    a completion's `started` and `ran` arrays, sent in binary (the text form
    costs a worker about 2 µs an element). None when no task's is known
    (the statement then records none)."""
    started, ran = Float8Array(), Float8Array()
    known = False
    for task_id in ids:
        run = runs.get(task_id) if runs else None
        if run is None:
            started.append(None)
            ran.append(None)
        else:
            known = True
            started.append(run[0])
            ran.append(run[1])
    return {"started": started, "ran": ran} if known else {"started": None, "ran": None}


def floats(values: list[float | None]) -> Float8Array | None:
    """A float8[] parameter sent in binary: None when no element is known."""
    if all(v is None for v in values):
        return None
    return Float8Array(None if v is None else float(v) for v in values)


def completion_params(
    tokens: Iterable[tuple[UUID, int]], runs: Mapping[UUID, RunTimes] | None
) -> dict[str, Any]:
    params: dict[str, Any] = token_params(tokens)
    return {**params, **run_params(params["ids"], runs)}


def complete(
    tokens: Iterable[tuple[UUID, int]],
    as_worker: WorkerKey | None = None,
    runs: Mapping[UUID, RunTimes] | None = None,
) -> Op[set[UUID]]:
    """Completes claimed tasks; returns the ids completed. A stale token is
    refused, and so is, `as_worker`, a task another worker holds. `runs`:
    the runs' measures by task id (a task without one is recorded as
    started when claimed, or when its heartbeat said)."""
    params = completion_params(tokens, runs)
    statement = _as(as_worker, query("complete"), query("worker_complete"), params)
    return set((yield from values(*statement)))


def fail(failures: Sequence[Failure], as_worker: WorkerKey | None = None) -> Op[list[FailOutcome]]:
    """Fails claimed tasks: retry after backoff (or `retry_at`), or dead after the
    last attempt (cancelled, if cancelled meanwhile). Stale tokens are refused
    (absent from the result)."""
    outcomes = yield from select(
        *_as(
            as_worker,
            query("fail"),
            query("worker_fail"),
            {
                "ids": UUIDArray(f.task_id for f in failures),
                "attempts": [f.attempt for f in failures],
                "errors": [_text(f.error) for f in failures],
                "retry_at": [f.retry_at for f in failures],
                "final": [f.final for f in failures],
                "tracebacks": [
                    None if f.traceback is None else _text(f.traceback) for f in failures
                ],
            },
        ),
        _FAIL_OUTCOMES,
    )
    return outcomes


_FAIL_OUTCOMES = Rows(FailOutcome)


def _text(text: str) -> str:
    """An error as stored: secrets masked (a handler's exception may show a
    URL with its password); a text column cannot hold NUL, which an
    exception's message can."""
    return redact(text).replace("\x00", "\\x00")


def defer_unknown(
    tokens: Iterable[tuple[UUID, int]],
    delay_seconds: float,
    grace_seconds: float,
    reason: str,
    as_worker: WorkerKey | None = None,
) -> Op[dict[UUID, str]]:
    """Hands back tasks whose name the worker does not know: run again after
    `delay_seconds` (no attempt used) until unknown for `grace_seconds`, then
    dead with `reason`. Returns {id: 'scheduled' or 'dead'}."""
    params = {
        **token_params(tokens),
        "delay": delay_seconds,
        "grace": grace_seconds,
        "reason": reason,
    }
    statement = _as(as_worker, query("defer_unknown"), query("worker_defer_unknown"), params)
    deferred = yield from select(*statement, _DEFERRED)
    return {task.id: task.status for task in deferred}


class _Deferred(NamedTuple):
    id: UUID
    status: str  # 'scheduled' or 'dead'


_DEFERRED = Rows(_Deferred)


class Held(NamedTuple):
    """A claim a worker holds: its (task id, attempt) token."""

    task_id: UUID
    attempt: int


_HELD = Rows(Held)


def worker_claims(worker: str | WorkerKey) -> Op[list[Held]]:
    """The (task id, attempt) tokens a worker holds now."""
    if isinstance(worker, WorkerKey):
        return select(query("worker_claims_held"), _keyed(worker, {}), _HELD)
    return select(query("worker_claims"), {"worker": worker}, _HELD)


def release(
    tokens: Iterable[tuple[UUID, int]], as_worker: WorkerKey | None = None
) -> Op[set[UUID]]:
    """Hands claimed-but-unstarted tasks back at their place; no attempt is used."""
    if as_worker is None:
        released = yield from values(
            query("requeue"), {**token_params(tokens), "consume": False, "reason": None}
        )
    else:
        released = yield from values(
            query("worker_release"), _keyed(as_worker, token_params(tokens))
        )
    return set(released)


def extend_leases(
    tokens: Iterable[tuple[UUID, int]],
    lease_seconds: float,
    as_worker: WorkerKey | None = None,
    started: Mapping[UUID, float] | None = None,
) -> Op[set[UUID]]:
    """Heartbeat: extends the leases; returns the ids still held by these
    tokens. `started`: of the tasks that started, the seconds from when
    their claim was sent to their start (RunTimes[0]), recorded as
    their start."""
    params: dict[str, Any] = {**token_params(tokens), "lease_seconds": lease_seconds}
    params["started"] = floats([started.get(t) for t in params["ids"]]) if started else None
    statement = _as(as_worker, query("extend_leases"), query("worker_extend_leases"), params)
    return set((yield from values(*statement)))


def register_worker(
    worker: str | WorkerKey,
    host: str,
    pid: int,
    queues: Sequence[str],
    concurrency: int,
    heartbeat_seconds: float | None = None,
) -> Op[None]:
    """Registers a worker; with a key, the worker proves itself with its
    secret from then on. It can be declared dead only once silent for two
    of its heartbeats."""
    key = worker if isinstance(worker, WorkerKey) else None
    yield Execute(
        query("register_worker"),
        {
            "id": worker.id if isinstance(worker, WorkerKey) else worker,
            "host": host,
            "pid": pid,
            "queues": list(queues),
            "concurrency": concurrency,
            "secret": None if key is None else key.secret,
            "heartbeat_seconds": heartbeat_seconds,
        },
    )


def record_run_times(times: dict[tuple[str, str], tuple[int, float]]) -> Op[None]:
    """Records runs and their seconds per (queue, tenant): in queues charged
    by time, what the next loads cost each tenant's tasks."""
    pairs = sorted(times.items())
    yield Execute(
        query("record_run_times"),
        {
            "queues": [queue for (queue, _), _ in pairs],
            "tenants": [tenant for (_, tenant), _ in pairs],
            "runs": [runs for _, (runs, _) in pairs],
            "seconds": [seconds for _, (_, seconds) in pairs],
        },
    )


def worker_heartbeat(worker: str | WorkerKey) -> Op[bool]:
    """False when the worker was declared dead meanwhile (it must stop)."""
    if isinstance(worker, WorkerKey):
        alive = yield from value(query("worker_beat"), _keyed(worker, {}))
    else:
        alive = yield from value(query("worker_heartbeat"), {"id": worker})
    return bool(alive)


def rejoin_worker(worker: WorkerKey) -> Op[bool]:
    """A worker declared dead while cut off comes back under its name; False
    when its row is gone (pruned), and it must stop."""
    return bool((yield from value(query("worker_rejoin"), _keyed(worker, {}))))


def stop_worker(worker: str | WorkerKey) -> Op[None]:
    if isinstance(worker, WorkerKey):
        yield Execute(query("worker_stop"), _keyed(worker, {}))
    else:
        yield Execute(query("stop_worker"), {"id": worker})


def listen_cancel() -> Op[None]:
    """Subscribes the connection to the NOTIFY sent when a running task is
    cancelled (the payload is "worker task")."""
    yield Execute(query("listen_cancel"))


def listen_ready() -> Op[None]:
    """Subscribes the connection to the NOTIFY sent when tasks become
    claimable (the payload is the queue's name)."""
    yield Execute(query("listen_ready"))
