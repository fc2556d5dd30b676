"""A task's result, by its id: `app.result(task_id)`.

    result = app.result(task_id)
    result.status()             # "waiting", "running", "succeeded", "dead", ...
    value = result.get(timeout=30)
    value = await result.aget(timeout=30)
    result.progress()           # Progress(done=40.0, total=120.0, ...), or None

`get` waits on PostgreSQL's NOTIFY (the worker notifies when it keeps a
result, or when a task that keeps results ends without one): no table is
polled while nothing happens. Only tasks declared with `result_ttl` keep
their return value.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING
from uuid import UUID

import orjson

from rota.core import connections, db
from rota.core.progress import task_progress
from rota.core.results import ResultState, listen_results, task_result
from rota.errors import ResultExpired, ResultNotKept, TaskCancelled, TaskFailed
from rota.model.progress import Progress

__all__ = ["Progress", "Result"]

if TYPE_CHECKING:
    from rota.settings import Settings

# A waiter also looks again this often, should a notification be missed
# (its connection lost and made again, or a task cancelled while waiting).
RECHECK_SECONDS = 5.0
# Behind a transaction pooler with no direct URL there is no LISTEN: polled.
POLL_SECONDS = 0.5

STATUSES = {"pending": "waiting"}


class Result:
    """What a task returned, once it has; see the module's docstring."""

    def __init__(self, settings: Settings, task_id: UUID) -> None:
        self.settings = settings
        self.task_id = task_id

    def __repr__(self) -> str:
        return f"<rota.Result {self.task_id}>"

    def status(self) -> str:
        """waiting, scheduled, running, succeeded, dead or cancelled; unknown
        when PostgreSQL has no trace of it yet (still in the buffer) or any
        more (pruned), or no such task."""
        with connections.connect(self.settings, "results") as conn:
            state = db.run(conn, task_result(self.task_id))
        return "unknown" if state is None else STATUSES.get(state.status, state.status)

    def progress(self) -> Progress | None:
        """The task's last reported progress (`rota.context().progress()`),
        while it runs and after it ended, for as long as its record is kept;
        None when it reported none (or is not in PostgreSQL)."""
        with connections.connect(self.settings, "results") as conn:
            return db.run(conn, task_progress(self.task_id))

    async def aprogress(self) -> Progress | None:
        """`progress` for asyncio."""
        conn = await connections.aconnect(self.settings, "results")
        async with conn:
            return await db.arun(conn, task_progress(self.task_id))

    def get(self, timeout: float | None = None) -> object:
        """The task's return value, once it succeeded; waits up to `timeout`
        seconds (None: as long as it takes), then raises TimeoutError. A dead
        task raises TaskFailed (its last error and traceback), a cancelled
        one TaskCancelled, an expired result ResultExpired, a task that keeps
        none (or whose result was refused) ResultNotKept."""
        deadline = None if timeout is None else time.monotonic() + timeout
        listens = self.settings.session_database_url is not None
        with connections.connect(self.settings, "wait") as conn:
            if listens:
                db.run(conn, listen_results())
            while True:
                ended, value = _ended(self.task_id, db.run(conn, task_result(self.task_id)))
                if ended:
                    return value
                wait = _left(deadline, self.task_id)
                if not listens:
                    time.sleep(min(wait, POLL_SECONDS))
                    continue
                for note in conn.notifies(timeout=min(wait, RECHECK_SECONDS)):
                    if str(self.task_id) in note.payload:  # ids, comma-separated
                        break

    async def aget(self, timeout: float | None = None) -> object:
        """`get` for asyncio."""
        import asyncio

        deadline = None if timeout is None else time.monotonic() + timeout
        listens = self.settings.session_database_url is not None
        conn = await connections.aconnect(self.settings, "wait")
        async with conn:
            if listens:
                await db.arun(conn, listen_results())
            while True:
                state = await db.arun(conn, task_result(self.task_id))
                ended, value = _ended(self.task_id, state)
                if ended:
                    return value
                wait = _left(deadline, self.task_id)
                if not listens:
                    await asyncio.sleep(min(wait, POLL_SECONDS))
                    continue
                async for note in conn.notifies(timeout=min(wait, RECHECK_SECONDS)):
                    if str(self.task_id) in note.payload:  # ids, comma-separated
                        break


def _left(deadline: float | None, task_id: UUID) -> float:
    if deadline is None:
        return RECHECK_SECONDS
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"task {task_id} has not ended")
    return left


def _ended(task_id: UUID, state: ResultState | None) -> tuple[bool, object]:
    """(True, the value) once the task succeeded with a result kept; raises
    when it ended otherwise; (False, None) while it has not ended."""
    if state is None or state.status in ("pending", "scheduled", "running"):
        return False, None
    if state.status == "dead":
        raise TaskFailed(task_id, state.error, state.traceback)
    if state.status == "cancelled":
        raise TaskCancelled(task_id, f"task {task_id} was cancelled")
    if not state.kept:
        raise ResultNotKept(
            task_id, f"task {task_id} succeeded; its task keeps no result (no result_ttl)"
        )
    if state.refused is not None:
        raise ResultNotKept(task_id, f"task {task_id} succeeded; {state.refused}")
    if state.value is None:
        raise ResultExpired(
            task_id, f"task {task_id} succeeded; its result expired at {state.expires_at}"
        )
    return True, orjson.loads(state.value)
