"""What the in-memory queue shows of its tasks: each task's record, each run
of one, and what `run_all` did."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import orjson

from rota.model.envelope import TaskEnvelope

Status = Literal["pending", "scheduled", "running", "succeeded", "dead"]
Outcome = Literal["succeeded", "retried", "dead"]


@dataclass(eq=False)
class TaskRecord:
    """One task, as rota.tasks would hold it. `status` is rota's: pending (in
    line), scheduled (an ETA or a retry's backoff not reached: see `run_at`),
    running, succeeded or dead. `error` and `traceback` are the last failed
    attempt's, as a worker stores them; `result` is what the task returned."""

    id: UUID
    name: str
    queue: str
    tenant: str
    payload: str  # the JSON the task was stored with: {"args": [...], "kwargs": {...}}
    cost: float
    max_attempts: int
    backoff_base: float
    backoff_max: float
    enqueued_at: datetime
    eta: datetime | None
    priority: int = 0  # 0..9, higher runs first within its tenant
    status: Status = "pending"
    attempts: int = 0
    run_at: datetime | None = None
    error: str | None = None
    traceback: str | None = None
    result: Any = None
    finished_at: datetime | None = None
    arrival: int = field(default=0, repr=False)

    @classmethod
    def of(cls, envelope: TaskEnvelope, arrival: int) -> TaskRecord:
        e = envelope
        return cls(
            e.id,
            e.name,
            e.queue,
            e.tenant,
            e.payload,
            e.cost,
            e.max_attempts,
            e.backoff_base,
            e.backoff_max,
            e.enqueued_at,
            e.eta,
            e.priority,
            arrival=arrival,
        )

    @property
    def args(self) -> list[Any]:
        """The positional arguments, as the worker gets them (through JSON)."""
        return list(orjson.loads(self.payload)["args"])

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(orjson.loads(self.payload)["kwargs"])


@dataclass(frozen=True)
class Run:
    """One attempt of a task and what came of it: succeeded, retried (it
    failed and runs again later) or dead (it failed and is out of attempts)."""

    task: TaskRecord
    attempt: int
    outcome: Outcome
    error: str | None = None
    result: Any = None


@dataclass(frozen=True)
class Results:
    """The attempts one `run_all` made, in the order they ran."""

    runs: list[Run] = field(default_factory=list)

    def _count(self, outcome: Outcome) -> int:
        return sum(run.outcome == outcome for run in self.runs)

    @property
    def succeeded(self) -> int:
        return self._count("succeeded")

    @property
    def retried(self) -> int:
        return self._count("retried")

    @property
    def dead(self) -> int:
        return self._count("dead")

    @property
    def failed(self) -> int:
        """Attempts that failed: retried or dead."""
        return self.retried + self.dead

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self) -> Iterator[Run]:
        return iter(self.runs)
