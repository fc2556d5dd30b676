"""`InMemory`: an app's enqueues go to memory, and its tasks run there, one at
a time, in rota's fair order, with the worker's own rules for their outcomes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any
from uuid import UUID

import orjson

from rota import core
from rota.app import App
from rota.buffer.streams import Rejected
from rota.consumer.reports import Unreported
from rota.consumer.running import (
    Outcome,
    TaskAborted,
    TaskTimeout,
    sort_outcome,
)
from rota.model.rules import check_time
from rota.producer import ProducerCore
from rota.runtime.current import current_task
from rota.task import Task
from rota.testing.line import Line
from rota.testing.producer import Effects, MemoryAsyncProducer, MemoryProducer
from rota.testing.records import Results, Run, Status, TaskRecord

# What run_all runs at most, unless told otherwise (a task that enqueues
# itself for now would otherwise run forever).
RUN_LIMIT = 10_000
Ended = tuple[BaseException | None, Any]  # (the error, or None; the result)
TaskFilter = str | Task[Any, Any] | None  # a task's name, or the task


class InMemory:
    """While entered, `app`'s enqueues (sync, async, `connection=`) are checked
    as in production and stored here; no Redis or PostgreSQL client is made.

    The clock is real time plus what `advance` added: enqueue times,
    `countdown=`, ETAs, retries' backoffs and `rota.Retry(countdown=...)` all
    read it. `weights` are tenants' weights (1 by default); `capacities`
    tenants' capacities (backpressure, `rota.CapacityExceeded`)."""

    def __init__(
        self,
        app: App,
        *,
        now: datetime | None = None,
        weights: Mapping[str, float] | None = None,
        capacities: Mapping[str, int] | None = None,
    ) -> None:
        self.app = app
        self.line = Line(weights)
        self._offset = timedelta(0)
        if now is not None:
            self._offset = check_time("now", now) - datetime.now(UTC)
        settings = app.settings
        self._core = ProducerCore(settings)
        self._effects = Effects(settings, self.line, self.now, capacities or {})
        self.producer = MemoryProducer(settings, self._core, self._effects)
        self.aproducer = MemoryAsyncProducer(settings, self._core, self._effects)
        self._saved: list[tuple[Any, ...]] = []

    # -- installing --------------------------------------------------------------

    def __enter__(self) -> InMemory:
        app = self.app
        self._saved.append((app._core, app._producer, app._aproducer, app.clock))
        app._core, app._producer, app._aproducer = self._core, self.producer, self.aproducer
        app.clock = self.now
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        app = self.app
        app._core, app._producer, app._aproducer, app.clock = self._saved.pop()

    # -- the clock ---------------------------------------------------------------

    def now(self) -> datetime:
        return datetime.now(UTC) + self._offset

    def advance(self, seconds: float | timedelta = 0, *, to: datetime | None = None) -> datetime:
        """Moves the clock forward by `seconds`, or to `to`; returns the new now."""
        if to is not None:
            step = check_time("to", to) - self.now()
        else:
            step = seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)
        if step < timedelta(0):
            raise ValueError("the clock only goes forward")
        self._offset += step
        return self.now()

    # -- running -------------------------------------------------------------------

    def run_all(
        self, *, now: datetime | None = None, advance: bool = False, limit: int = RUN_LIMIT
    ) -> Results:
        """Runs due tasks, one at a time in fair order, until none is due
        (tasks they enqueue included); returns what each attempt came to.
        `now=`: first moves the clock there. `advance=True`: when nothing is
        due, moves the clock to the next scheduled task (ETAs, retries) and
        carries on, until nothing is left. At most `limit` attempts.
        Async tasks run on an event loop of their own (from a coroutine,
        `await arun_all()` runs them on its loop instead)."""
        if now is not None:
            self.advance(to=now)
        runs: list[Run] = []
        while len(runs) < limit:
            run = self.run_next()
            if run is None and not (advance and self._skip_to_next_due()):
                break
            if run is not None:
                runs.append(run)
        return Results(runs)

    async def arun_all(
        self, *, now: datetime | None = None, advance: bool = False, limit: int = RUN_LIMIT
    ) -> Results:
        """`run_all` from a coroutine: async tasks are awaited on the running loop."""
        if now is not None:
            self.advance(to=now)
        runs: list[Run] = []
        while len(runs) < limit:
            run = await self.arun_next()
            if run is None and not (advance and self._skip_to_next_due()):
                break
            if run is not None:
                runs.append(run)
        return Results(runs)

    def run_next(self) -> Run | None:
        """Runs the next due task in fair order, if any."""
        claimed = self._claim()
        if claimed is None:
            return None
        task, record = claimed
        registered = self.app.tasks[record.name]
        if not registered.is_async:
            return self._finish(record, task, self._run_sync(registered, task))
        coroutine = self._run_async(registered, task)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._finish(record, task, asyncio.run(coroutine))
        # Called from a coroutine: the task gets a loop of its own, on a thread.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return self._finish(record, task, pool.submit(asyncio.run, coroutine).result())

    async def arun_next(self) -> Run | None:
        claimed = self._claim()
        if claimed is None:
            return None
        task, record = claimed
        registered = self.app.tasks[record.name]
        if registered.is_async:
            return self._finish(record, task, await self._run_async(registered, task))
        return self._finish(record, task, self._run_sync(registered, task))

    def _skip_to_next_due(self) -> bool:
        due = self.line.next_due()
        if due is None:
            return False
        self._offset = max(self._offset, due - datetime.now(UTC))
        return True

    def _claim(self) -> tuple[core.ClaimedTask, TaskRecord] | None:
        now = self.now()
        record = self.line.claim(now, self.app.tasks)
        if record is None:
            return None
        task = core.ClaimedTask(
            record.id,
            record.name,
            orjson.loads(record.payload),
            record.queue,
            record.tenant,
            record.attempts,
            record.max_attempts,
            now + timedelta(seconds=self.app.settings.lease_seconds),
            record.enqueued_at,
        )
        return task, record

    def _run_sync(self, registered: Task[Any, Any], task: core.ClaimedTask) -> Ended:
        """As the worker's thread pool runs it: any exception fails it (SystemExit
        too); past its timeout it is failed and its late result ignored."""

        def call() -> Any:
            current_task.set(task)
            return registered.fn(*task.args, **task.kwargs)

        context = contextvars.copy_context()
        timeout = registered.options.timeout
        if timeout is None:
            try:
                return None, context.run(call)
            except BaseException as exc:
                return exc, None
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rota-testing")
        future = pool.submit(context.run, call)
        pool.shutdown(wait=False)
        concurrent.futures.wait([future], timeout)
        if not future.done():
            return TaskTimeout(f"timed out after {timeout} s"), None
        error = future.exception()
        return error, None if error is not None else future.result()

    async def _run_async(self, registered: Task[Any, Any], task: core.ClaimedTask) -> Ended:
        """As the worker's event loop runs it (rota.consumer.worker)."""
        token = current_task.set(task)
        try:
            result = await asyncio.wait_for(
                registered.fn(*task.args, **task.kwargs), registered.options.timeout
            )
        except TimeoutError:
            return TaskTimeout(f"timed out after {registered.options.timeout} s"), None
        except (SystemExit, KeyboardInterrupt) as exc:
            return TaskAborted(f"the task raised {type(exc).__name__}"), None
        except Exception as exc:
            return exc, None
        finally:
            current_task.reset(token)
        return None, result

    def _finish(self, record: TaskRecord, task: core.ClaimedTask, ended: Ended) -> Run:
        """The worker's outcome rules (`sort_outcome`), then what rota.fail does."""
        error, result = ended
        unreported = Unreported()
        sort_outcome(Outcome(task, error), unreported)
        now = self.now()
        if not unreported.failed:
            outcome = self.line.complete(record, result, now)
            return Run(record, task.attempt, outcome, result=result)
        failure = unreported.failed[0]
        if failure.retry_at is not None:  # rota.Retry(countdown=): on the real clock
            failure = dataclasses.replace(failure, retry_at=failure.retry_at + self._offset)
        outcome = self.line.fail(failure, now)
        return Run(record, task.attempt, outcome, record.error)

    # -- looking -------------------------------------------------------------------

    def tasks(
        self,
        *statuses: Status,
        task: TaskFilter = None,
        tenant: str | None = None,
        queue: str | None = None,
    ) -> list[TaskRecord]:
        """Every task (of those statuses, when given), in enqueue order."""
        name = task.name if isinstance(task, Task) else task
        with self.line.lock:
            return [
                r
                for r in self.line.tasks.values()
                if (not statuses or r.status in statuses)
                and (name is None or r.name == name)
                and (tenant is None or r.tenant == tenant)
                and (queue is None or r.queue == queue)
            ]

    def waiting(
        self, *, task: TaskFilter = None, tenant: str | None = None, queue: str | None = None
    ) -> list[TaskRecord]:
        """Tasks yet to run: in line, or scheduled (an ETA, a retry's backoff)."""
        return self.tasks("pending", "scheduled", task=task, tenant=tenant, queue=queue)

    def failed(
        self, *, task: TaskFilter = None, tenant: str | None = None, queue: str | None = None
    ) -> list[TaskRecord]:
        """Waiting tasks whose last attempt failed: they will be retried."""
        return [r for r in self.waiting(task=task, tenant=tenant, queue=queue) if r.attempts]

    def done(
        self, *, task: TaskFilter = None, tenant: str | None = None, queue: str | None = None
    ) -> list[TaskRecord]:
        """Tasks that succeeded."""
        return self.tasks("succeeded", task=task, tenant=tenant, queue=queue)

    def dead(
        self, *, task: TaskFilter = None, tenant: str | None = None, queue: str | None = None
    ) -> list[TaskRecord]:
        """Tasks out of attempts (or failed for good), with their last error."""
        return self.tasks("dead", task=task, tenant=tenant, queue=queue)

    def get(self, task_id: UUID) -> TaskRecord:
        return self.line.tasks[task_id]

    @property
    def dead_letters(self) -> list[Rejected]:
        """Tasks a loader would have refused (none, while the SDK and the loader agree)."""
        return self._effects.dead_letters
