"""What a worker keeps of the tasks it runs, and how their ends are told apart."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple
from uuid import UUID

from rota import core
from rota.consumer.reports import MESSAGE_MAX, Unreported, describe, full_traceback
from rota.core import connections, db
from rota.core.results import KeptResult
from rota.errors import Cancelled, Retry, ValidationError
from rota.model.envelope import dump_result
from rota.model.rules import check_delay
from rota.runtime import tracing
from rota.runtime.current import CancelFlag, current_cancel, current_task
from rota.runtime.outage import Outage, run_rounds
from rota.runtime.progress import ProgressSlot, current_progress
from rota.settings import Settings

if TYPE_CHECKING:
    from rota.app import App
    from rota.consumer.processes import Children
    from rota.task import Task

log = logging.getLogger("rota.worker")

# How long a listener waits for a NOTIFY before checking whether to stop.
NOTIFY_WAIT_SECONDS = 1.0


class TaskTimeout(Exception):
    pass


@dataclass
class InFlight:
    task: core.ClaimedTask
    timeout: float | None
    keep: float | None = None  # seconds its result is kept (None: not kept)
    # Kept only for its workflow's join: a null result needs no row (the join
    # gets null for a member without one).
    for_join: bool = False
    # The event loop's, once an async task is handed over (a sync task has none).
    future: concurrent.futures.Future[Any] | None = None
    # When (time.monotonic()) the claim or heartbeat that last set its lease
    # was sent: the lease runs `lease_seconds` from a later moment.
    leased_from: float = 0.0
    # When (time.monotonic()) its claim was sent: its start is told to the
    # database as seconds from it (rota.core.RunTimes). None: leased_from's
    # first value (the claim's).
    claim_sent: float | None = None
    started_at: float | None = None  # set when it really starts (not when prefetched)
    timed_out: bool = False
    waited: float | None = None  # seconds from its enqueue to its start
    handed_back: bool = False  # at shutdown, before it started: it must not start
    # Raised when its cancel is asked: the task sees it (rota.context().cancelled).
    cancel: CancelFlag = field(default_factory=CancelFlag)
    # Kills the child process running it (the process pool), once it started.
    kill: Callable[[], None] | None = None
    # Where its progress waits for the heartbeat thread's flush (rota.consumer.progress).
    progress: ProgressSlot | None = None

    def __post_init__(self) -> None:
        if self.claim_sent is None:
            self.claim_sent = self.leased_from

    def lease_ran_out(self, lease_seconds: float) -> bool:
        """Whether the task's lease may have expired: longer than a lease
        since the claim or heartbeat that last set it was sent."""
        return time.monotonic() > self.leased_from + lease_seconds

    def begin(self) -> None:
        self.started_at = time.monotonic()
        self.waited = max(0.0, time.time() - self.task.enqueued_at.timestamp())

    def started_after(self) -> float | None:
        """Seconds from when its claim was sent to its start (None: not started)."""
        if self.started_at is None or self.claim_sent is None:
            return None
        return self.started_at - self.claim_sent

    def outcome(self, value: Any) -> Outcome:
        """Its success, returning `value`."""
        keep = None if value is None and self.for_join else self.keep
        return Outcome(self.task, None, value if keep is not None else None, keep)

    def killed_by(self, kill: Callable[[], None]) -> None:
        self.kill = kill

    def hand_back(self) -> bool:
        """Whether the task, not started, is kept from starting now (under
        TaskPool.starting for a sync task)."""
        if self.future is not None:  # the event loop's
            return self.future.cancel()
        self.handed_back = True
        return True


class TaskPool:
    """`size` threads running sync tasks' calls in the order submitted:
    cheaper per task than a ThreadPoolExecutor (no future, no work item);
    each call records its task's outcome itself. Starting a task and handing
    it back take `starting`, so that they exclude each other."""

    def __init__(self, size: int, name: str) -> None:
        self.starting = threading.Lock()
        self._calls: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}_{n}", daemon=True)
            for n in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, call: Callable[..., None], *args: Any) -> None:
        self._calls.put((call, args))

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            item[0](*item[1])

    def shutdown(self) -> None:
        """Drops the calls not yet started; each thread ends after its current one."""
        with contextlib.suppress(queue.Empty):
            while True:
                self._calls.get_nowait()
        for _ in self._threads:
            self._calls.put(None)


class Attempt(NamedTuple):
    """An attempt that ran, as the metrics count it."""

    queue: str
    tenant: str
    waited: float  # seconds from its enqueue to its start
    ran: float  # seconds
    failed: bool


@dataclass
class Outcome:
    task: core.ClaimedTask
    error: BaseException | None  # None: success
    value: Any = None  # what the task returned, when its result is kept
    keep: float | None = None  # seconds its result is kept (None: not kept)
    # When it ended (time.monotonic): its run time is measured to here, not
    # to when the claim loop collects it.
    ended: float = field(default_factory=time.monotonic)


class StaleClaim(Exception):
    """A prefetched task whose lease ran out while the database was out of
    reach: not started (another worker may hold it now); handed back."""


class TaskAborted(Exception):
    """An async task raised SystemExit or KeyboardInterrupt: it fails like any
    error instead of stopping the worker's event loop."""


def call_sync(registered: Task[Any, Any], flight: InFlight, children: Children | None) -> Any:
    """One run of a sync task, in this thread or in a child process."""
    with tracing.run(flight.task):
        if children is None:
            current_task.set(flight.task)
            current_cancel.set(flight.cancel)
            current_progress.set(flight.progress)
            return registered.fn(*flight.task.args, **flight.task.kwargs)
        options = registered.options
        keep = flight.keep is not None
        return children.run(
            flight.task,
            options.timeout,
            options.soft_timeout,
            keep,
            flight.cancel,
            flight.killed_by,
            flight.progress,
        )


async def run_async(
    registered: Task[Any, Any], flight: InFlight, slots: asyncio.Semaphore, lease_seconds: float
) -> Any:
    """One run of an async task on the worker's event loop, in one of its `slots`."""
    async with slots:
        if flight.lease_ran_out(lease_seconds):
            raise StaleClaim()
        flight.begin()
        current_task.set(flight.task)
        current_cancel.set(flight.cancel)
        current_progress.set(flight.progress)
        try:
            with tracing.run(flight.task):
                return await asyncio.wait_for(
                    registered.fn(*flight.task.args, **flight.task.kwargs), flight.timeout
                )
        except TimeoutError:
            raise TaskTimeout(f"timed out after {flight.timeout} s") from None
        except (SystemExit, KeyboardInterrupt) as exc:
            raise TaskAborted(f"the task raised {type(exc).__name__}") from None


def apply_cancels(
    cancels: collections.deque[UUID],
    in_flight: dict[UUID, InFlight],
    starting: threading.Lock,
    unreported: Unreported,
    ended: Callable[[Outcome], None],
) -> None:
    """Stops the tasks whose cancel was asked: one not started is handed
    back (its release ends it cancelled); an async one is cancelled at its
    await; a sync one sees it (`rota.context().cancelled`) and stops itself,
    or, in the process pool, is killed with its process.
    Each ends once, as its report settles (a completion first wins)."""
    while cancels:
        flight = in_flight.get(cancels.popleft())
        if flight is None:
            continue  # already ended, or not this worker's
        flight.cancel.asked = True
        with starting:
            unstarted = flight.started_at is None and flight.hand_back()
        if unstarted:
            del in_flight[flight.task.id]
            unreported.stale.append(flight.task.token)
        elif flight.future is not None and flight.future.cancel():
            ended(Outcome(flight.task, Cancelled(f"task {flight.task.id} was cancelled")))
        elif flight.kill is not None:
            flight.kill()  # its thread sees the child die, and ends it cancelled
        log.info(
            "task %s: cancelled while %s", flight.task.id, "waiting" if unstarted else "running"
        )


def expire_timeouts(flights: Iterable[InFlight], outcomes: collections.deque[Outcome]) -> None:
    """A sync task past its timeout is failed now; its thread cannot be
    killed, so its eventual result is ignored (documented)."""
    now = time.monotonic()
    for flight in list(flights):
        if (
            flight.timeout is not None
            and flight.started_at is not None
            and not flight.timed_out
            and now - flight.started_at > flight.timeout
        ):
            flight.timed_out = True
            timeout = TaskTimeout(f"timed out after {flight.timeout} s")
            outcomes.append(Outcome(flight.task, timeout))


def worker_queues(app: App, fixed: list[str] | None, exclude: set[str]) -> list[str]:
    """--queues (`fixed`), else the queues the app's tasks declare (never other
    services' queues); minus --exclude."""
    declared = {t.options.queue for t in app.tasks.values()}
    if fixed is not None:
        names = fixed
        unused = sorted(set(names) - declared)
        if unused:
            log.warning(
                "--queues names %s, which no task of this app uses: their tasks are "
                "handed back for a worker that knows them",
                unused,
            )
    else:
        names = sorted(declared)
    return [q for q in names if q not in exclude]


def retry_failure(task: core.ClaimedTask, retry: Retry) -> core.Failure:
    """rota.Retry: run again after its countdown, or the task's backoff when
    it gave none or one out of bounds (said in the stored reason)."""
    reason = retry.reason if isinstance(retry.reason, str) else describe(retry)
    retry_at = None
    if retry.countdown is not None:
        try:
            seconds = check_delay("Retry countdown", retry.countdown)
        except ValidationError as exc:
            reason = f"{reason} ({exc}; retried after the task's backoff instead)"
        else:
            retry_at = datetime.now(UTC) + timedelta(seconds=seconds)
    return core.Failure(task.id, task.attempt, reason[:MESSAGE_MAX], retry_at)


def sort_outcome(
    outcome: Outcome, unreported: Unreported, max_result_bytes: int = 1024 * 1024
) -> None:
    """Files a finished task's outcome under what is to be reported."""
    task, error = outcome.task, outcome.error
    if outcome.keep is not None and error is None:
        data, refused = dump_result(outcome.value, max_result_bytes)
        if refused is not None:
            log.warning("task %s succeeded; its result is not kept: %s", task.id, refused)
        unreported.kept.append(KeptResult(task.token, data, refused, outcome.keep))
        return
    if outcome.keep is not None and not isinstance(error, StaleClaim):
        unreported.waited.add(task.id)
    if isinstance(error, StaleClaim):
        log.warning(
            "not starting task %s: its lease ran out while the database was out of reach; "
            "handing it back",
            task.id,
        )
        unreported.stale.append(task.token)
    elif error is None:
        unreported.done.append(task.token)
    elif isinstance(error, Retry):
        failure = retry_failure(task, error)
        log.info("task %s (tenant %s) asked to be retried: %s", task.id, task.tenant, failure.error)
        unreported.failed.append(failure)
    elif isinstance(error, Cancelled):
        # Asked for, not a failure: no traceback. Reported as a failure, which
        # the cancel asked of the task's row ends cancelled.
        log.info(
            "task %s (%s, tenant %s) cancelled on attempt %d: %s",
            task.id,
            task.name,
            task.tenant,
            task.attempt,
            error,
        )
        unreported.failed.append(core.Failure(task.id, task.attempt, describe(error)))
    else:
        trace = full_traceback(error)
        log.warning(
            "task %s (%s, tenant %s) failed on attempt %d of %d:\n%s",
            task.id,
            task.name,
            task.tenant,
            task.attempt,
            task.max_attempts,
            trace.rstrip(),
        )
        failure = core.Failure(task.id, task.attempt, describe(error), traceback=trace)
        unreported.failed.append(failure)


def listen(
    settings: Settings,
    queues: list[str],
    wake: threading.Event,
    stopping: threading.Event,
    cancel: Callable[[UUID], None] = lambda _task: None,
    worker: str = "",
) -> None:
    """Sets `wake` on each NOTIFY for one of `queues`, and calls `cancel`
    with each task of `worker` cancelled while it runs, until `stopping`;
    after a lost connection it listens again once reconnected (the claim
    loop polls meanwhile). Without a session URL (behind a transaction
    pooler) it returns at once and the claim loop polls."""
    wanted = set(queues)
    mine = worker + " "
    # LISTEN needs a session: never a pooled one (the "listen" connection
    # goes to Settings.session_database_url).
    if settings.session_database_url is None:
        log.info(
            "behind a transaction pooler without ROTA_DIRECT_DATABASE_URL: no LISTEN, "
            "new tasks are found by polling every %s s",
            settings.poll_seconds,
        )
        return

    def listening() -> None:
        with connections.connect(settings, "listen") as conn:
            db.run(conn, core.listen_ready())
            db.run(conn, core.listen_cancel())
            outage.recovered()
            while not stopping.is_set():
                for note in conn.notifies(timeout=NOTIFY_WAIT_SECONDS):
                    if note.channel == "rota_cancel":
                        if note.payload.startswith(mine):
                            cancel(UUID(note.payload[len(mine) :]))
                    elif note.payload in wanted:
                        wake.set()

    outage = Outage("PostgreSQL (LISTEN)", log)
    run_rounds(listening, outage, db.SERVER_LOST, stopping)
