"""The worker: claims tasks in fair order, runs them, reports in batches.

Threads, each with its own connection:
  - the main loop claims up to the free slots, hands tasks to a thread pool
    (sync tasks) or an event loop (async tasks), and completes or fails the
    finished ones in batches;
  - a listener wakes the main loop on NOTIFY (one per loaded batch), with a
    jittered polling fallback so a fleet does not stampede;
  - a heartbeat extends the leases of running tasks, keeps the worker's row
    alive, and runs the maintenance duties when this worker holds their lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import os
import queue
import random
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg

from rota import db, ops
from rota.consumer.maintenance import Leadership, Maintenance
from rota.errors import Retry, ValidationError
from rota.outage import Outage, retrying
from rota.producer.app import App, Task
from rota.rules import check_delay
from rota.settings import Settings
from rota.sql import query

log = logging.getLogger("rota.worker")

current_task: contextvars.ContextVar[ops.ClaimedTask] = contextvars.ContextVar("rota_task")


class TaskTimeout(Exception):
    pass


@dataclass
class InFlight:
    task: ops.ClaimedTask
    timeout: float | None
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)
    claimed_at: float = 0.0
    started_at: float | None = None  # set when it really starts (not when prefetched)
    timed_out: bool = False

    def begin(self) -> None:
        self.started_at = time.monotonic()


@dataclass
class Outcome:
    task: ops.ClaimedTask
    error: BaseException | None  # None: success


class StaleClaim(Exception):
    """A prefetched task whose lease ran out while the database was out of
    reach: not started (another worker may hold it now); handed back."""


class TaskAborted(Exception):
    """An async task raised SystemExit or KeyboardInterrupt: it fails like any
    error instead of stopping the worker's event loop."""


def describe(error: BaseException) -> str:
    """An exception as one stored line; never raises, whatever its __str__ does."""
    try:
        text = "".join(traceback.format_exception_only(error)).strip()
    except Exception:
        text = f"{type(error).__name__} (its message could not be read)"
    return text[:4000]


Item = TypeVar("Item")

# What makes a loop reconnect: the connection is lost or cannot be made.
RECONNECT_ERRORS = (psycopg.OperationalError,)


class Worker:
    def __init__(
        self,
        app: App,
        queues: Sequence[str] | None = None,
        exclude: Sequence[str] = (),
        concurrency: int = 4,
        batch_size: int = 10,
        maintenance: bool = True,
    ) -> None:
        self.app = app
        self.settings = app.settings
        self.fixed_queues = list(queues) if queues else None
        self.exclude = set(exclude)
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.run_maintenance = maintenance
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self.in_flight: dict[uuid.UUID, InFlight] = {}
        self.outcomes: queue.Queue[Outcome] = queue.Queue()
        self.processed = 0
        # Outcomes taken off `outcomes` but not yet reported. They stay here
        # until a report succeeds, so a lost connection keeps them for after
        # reconnecting (fencing refuses any whose lease went elsewhere meanwhile).
        self.unreported_done: list[tuple[uuid.UUID, int]] = []
        self.unreported_failed: list[ops.Failure] = []
        self.unknown: list[tuple[uuid.UUID, int]] = []  # names this app does not know
        self.stale: list[tuple[uuid.UUID, int]] = []  # StaleClaim: to hand back
        # After a claim that could not be read: claims of one task, this many
        # times, to find the task that caused it.
        self.narrowing = 0
        self.claims_outage = Outage("PostgreSQL (claims and reports)", log)
        # When a heartbeat last reached the database: leases run out `lease`
        # seconds after it (or after their claim, if later).
        self.last_heartbeat = time.monotonic()
        self._pool = concurrent.futures.ThreadPoolExecutor(concurrency, "rota-task")
        self._loop = asyncio.new_event_loop()
        self._async_slots = asyncio.Semaphore(concurrency)
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="rota-async"
        )

    # -- lifecycle -------------------------------------------------------------

    def stop(self) -> None:
        """Graceful: stop claiming, hand back unstarted tasks, let running ones finish."""
        self.stopping.set()
        self.wake.set()

    def run(self) -> bool:
        """Runs until stopped; returns whether every task finished (False: some
        still ran after the shutdown grace and were handed back, and their
        threads cannot be stopped: the process should exit now)."""
        conn = retrying(self._connect, self.claims_outage, RECONNECT_ERRORS, self.stopping.wait)
        if conn is None:
            return True  # stopped before the database came back
        queues = self._queues()
        db.run(
            conn,
            ops.register_worker(
                self.id, socket.gethostname(), os.getpid(), queues, self.concurrency
            ),
        )
        self._loop_thread.start()
        helpers = [
            threading.Thread(target=self._listen, args=(queues,), daemon=True),
            threading.Thread(target=self._heartbeat, daemon=True),
        ]
        for helper in helpers:
            helper.start()
        log.info("worker %s on queues %s, concurrency %d", self.id, queues, self.concurrency)
        try:
            while not self.stopping.is_set():
                if conn is None:
                    conn = retrying(
                        self._connect, self.claims_outage, RECONNECT_ERRORS, self.stopping.wait
                    )
                    continue
                try:
                    self._step(conn, queues)
                except RECONNECT_ERRORS as exc:
                    # An outage: outcomes not yet reported are kept, and
                    # reported after reconnecting.
                    conn.close()
                    conn = None
                    self.stopping.wait(self.claims_outage.failed(exc))
                except Exception:
                    # Narrowed down to its task where it can be (claims and
                    # reports); anything else is logged, and the worker carries on.
                    log.exception("worker step failed; carrying on")
                    self.wake.wait(self.settings.poll_seconds)
            return self._shutdown(conn)
        finally:
            self.stopping.set()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._loop.call_soon_threadsafe(self._loop.stop)
            if conn is not None:
                conn.close()

    def _connect(self) -> psycopg.Connection[Any]:
        """The connection that claims and reports."""
        return db.connect(
            self.settings.database_url,
            synchronous_commit=self.settings.worker_synchronous_commit,
            connect_timeout=self.settings.database_timeout_seconds,
        )

    def _step(self, conn: psycopg.Connection[Any], queues: list[str]) -> None:
        """Reports what finished, then claims what fits; waits when there is nothing to do."""
        self._report(conn)
        self._expire_timeouts()
        # Up to one batch beyond the running tasks is prefetched.
        free = self.concurrency + self.batch_size - len(self.in_flight)
        wanted = min(self.batch_size, free)
        if self.in_flight and wanted < max(1, self.batch_size // 2):
            # Busy: let finished tasks gather, so that completing and claiming
            # stay batches rather than a round trip per task.
            self.wake.wait(0.005)
            self.wake.clear()
            return
        if self.narrowing:
            wanted = 1
        try:
            claimed = db.run(conn, ops.claim(queues, wanted, self.id, self.settings.lease_seconds))
        except psycopg.OperationalError:
            raise
        except Exception as exc:
            self._unreadable_claim(conn, exc)
            return
        if self.narrowing:
            self.narrowing -= 1
        for task in claimed:
            self._start(task)
        if len(claimed) < wanted:
            # Caught up: wait for a NOTIFY, a finished task, or the poll.
            self.wake.wait(self.settings.poll_seconds * random.uniform(0.5, 1.5))
            self.wake.clear()

    def _unreadable_claim(self, conn: psycopg.Connection[Any], error: Exception) -> None:
        """A claim committed but its rows could not be read (a row the rules of
        today would refuse, stored before them). The tasks it took are found
        by this worker's claims: one alone is the culprit and is dead with the
        reason; several are handed back (no attempt used) and claimed one at a
        time until the culprit is alone."""
        held = {task_id for task_id in self.in_flight}
        taken = [t for t in db.run(conn, ops.worker_claims(self.id)) if t[0] not in held]
        if len(taken) == 1:
            reason = f"claimed, but could not be read: {describe(error)}"
            log.error("task %s: %s", taken[0][0], reason)
            db.run(conn, ops.fail([ops.Failure(*taken[0], reason, final=True)]))
        elif taken:
            log.warning(
                "a claim of %d task(s) could not be read (%s); claiming one at a time",
                len(taken),
                describe(error),
            )
            db.run(conn, ops.release(taken))
            self.narrowing = len(taken)

    def _queues(self) -> list[str]:
        """--queues, else the queues its app's tasks declare (never other
        services' queues); minus --exclude."""
        declared = {t.options.queue for t in self.app.tasks.values()}
        if self.fixed_queues is not None:
            names = self.fixed_queues
            unused = sorted(set(names) - declared)
            if unused:
                log.warning(
                    "--queues names %s, which no task of this app uses: their tasks are "
                    "handed back for a worker that knows them",
                    unused,
                )
        else:
            names = sorted(declared)
        return [q for q in names if q not in self.exclude]

    def _shutdown(self, conn: psycopg.Connection[Any] | None) -> bool:
        """Hands back unstarted tasks at once, lets running ones finish within
        the grace, then hands back what still runs; returns whether all ended."""
        deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        unstarted = [
            f.task.token
            for f in list(self.in_flight.values())
            if f.started_at is None and f.future.cancel()
        ]
        for task_id, _ in unstarted:
            self.in_flight.pop(task_id, None)
        while self.in_flight and time.monotonic() < deadline:
            self.wake.wait(0.05)
            self.wake.clear()
            self._collect_outcomes()
        stuck = [f.task.token for f in list(self.in_flight.values())]
        if stuck:
            log.warning(
                "%d task(s) still running after the %s s grace: handing them back",
                len(stuck),
                self.settings.shutdown_grace_seconds,
            )
        # The last reports, on the connection if it is up, else on a new one
        # while the grace lasts (at least one try).
        for attempt in range(2):
            try:
                if conn is None or conn.closed:
                    conn = self._connect()
                self._report(conn)
                if unstarted or stuck:
                    db.run(conn, ops.release([*unstarted, *stuck]))
                db.run(conn, ops.stop_worker(self.id))
                break
            except RECONNECT_ERRORS as exc:
                if attempt or time.monotonic() >= deadline:
                    log.warning("could not report before exiting (leases will expire): %s", exc)
                    break
                if conn is not None:
                    conn.close()
                conn = None
        return not stuck

    # -- running tasks ---------------------------------------------------------

    def _start(self, task: ops.ClaimedTask) -> None:
        registered = self.app.tasks.get(task.name)
        if registered is None:
            self.unknown.append(task.token)
            return
        flight = InFlight(task, timeout=registered.options.timeout, claimed_at=time.monotonic())
        if registered.is_async:
            flight.future = asyncio.run_coroutine_threadsafe(
                self._run_async(registered, flight), self._loop
            )
        else:
            # The pool runs `concurrency` at a time; a prefetched task waits in
            # its queue, unstarted (and is handed back at shutdown).
            flight.future = self._pool.submit(self._run_sync, registered, flight)
        self.in_flight[task.id] = flight
        flight.future.add_done_callback(functools.partial(self._done, task))

    def _lease_ran_out(self, flight: InFlight) -> bool:
        """Whether the task's lease has surely expired: no heartbeat reached
        the database for longer than the lease since it was claimed."""
        held_until = max(flight.claimed_at, self.last_heartbeat) + self.settings.lease_seconds
        return time.monotonic() > held_until

    def _run_sync(self, registered: Task[Any, Any], flight: InFlight) -> Any:
        if self._lease_ran_out(flight):
            raise StaleClaim()
        flight.begin()
        current_task.set(flight.task)
        return registered.fn(*flight.task.args, **flight.task.kwargs)

    async def _run_async(self, registered: Task[Any, Any], flight: InFlight) -> Any:
        async with self._async_slots:
            if self._lease_ran_out(flight):
                raise StaleClaim()
            flight.begin()
            current_task.set(flight.task)
            try:
                return await asyncio.wait_for(
                    registered.fn(*flight.task.args, **flight.task.kwargs), flight.timeout
                )
            except TimeoutError:
                raise TaskTimeout(f"timed out after {flight.timeout} s") from None
            except (SystemExit, KeyboardInterrupt) as exc:
                raise TaskAborted(f"the task raised {type(exc).__name__}") from None

    def _done(self, task: ops.ClaimedTask, future: concurrent.futures.Future[Any]) -> None:
        if future.cancelled():
            return
        self.outcomes.put(Outcome(task, future.exception()))
        self.wake.set()

    def _expire_timeouts(self) -> None:
        """A sync task past its timeout is failed now; its thread cannot be
        killed, so its eventual result is ignored (documented)."""
        now = time.monotonic()
        for flight in list(self.in_flight.values()):
            if (
                flight.timeout is not None
                and flight.started_at is not None
                and not flight.timed_out
                and now - flight.started_at > flight.timeout
            ):
                flight.timed_out = True
                timeout = TaskTimeout(f"timed out after {flight.timeout} s")
                self.outcomes.put(Outcome(flight.task, timeout))

    def _report(self, conn: psycopg.Connection[Any]) -> None:
        """Reports what finished since the last call (and what a lost
        connection kept from being reported): completions, failures and
        unknown tasks, a statement each."""
        self._collect_outcomes()
        if self.unreported_done:
            completed = self._send(conn, self.unreported_done, ops.complete, lambda token: token)
            refused = len(self.unreported_done) - len(completed)
            if refused:
                log.warning(
                    "%d completion(s) refused: lease lost, or reported before the "
                    "connection was lost",
                    refused,
                )
            self.processed += len(self.unreported_done)
            self.unreported_done = []
        if self.unreported_failed:
            self._send(conn, self.unreported_failed, ops.fail, lambda f: (f.task_id, f.attempt))
            self.processed += len(self.unreported_failed)
            self.unreported_failed = []
        if self.stale:
            self._send(conn, self.stale, ops.release, lambda token: token)
            self.stale = []
        if self.unknown:
            settings = self.settings
            reason = (
                "unknown task: no worker whose app registers this name ran it within "
                f"ROTA_UNKNOWN_TASK_GRACE_SECONDS ({settings.unknown_task_grace_seconds:g} s)"
            )
            self._send(
                conn,
                self.unknown,
                lambda tokens: ops.defer_unknown(
                    tokens,
                    settings.unknown_task_retry_seconds,
                    settings.unknown_task_grace_seconds,
                    reason,
                ),
                lambda token: token,
            )
            self.unknown = []

    def _collect_outcomes(self) -> None:
        while True:
            try:
                outcome = self.outcomes.get_nowait()
            except queue.Empty:
                return
            if self.in_flight.pop(outcome.task.id, None) is None:
                continue  # already reported (a timeout, then the late result)
            task, error = outcome.task, outcome.error
            if isinstance(error, StaleClaim):
                log.warning(
                    "not starting task %s: its lease ran out while the database was out "
                    "of reach; handing it back",
                    task.id,
                )
                self.stale.append(task.token)
            elif error is None:
                self.unreported_done.append(task.token)
            elif isinstance(error, Retry):
                self.unreported_failed.append(_retry_failure(task, error))
            else:
                log.warning(
                    "task %s (%s, tenant %s) failed on attempt %d: %s",
                    task.id,
                    task.name,
                    task.tenant,
                    task.attempt,
                    describe(error),
                )
                self.unreported_failed.append(ops.Failure(task.id, task.attempt, describe(error)))

    def _send(
        self,
        conn: psycopg.Connection[Any],
        items: list[Item],
        op: Any,
        token_of: Any,
    ) -> Any:
        """Runs `op(items)`; if the database refuses it for its data (a lost
        connection is re-raised: an outage), one item at a time, and an item
        refused alone is failed for good with the reason, so that one task's
        bad row never holds back the others' reports."""
        try:
            return db.run(conn, op(items))
        except psycopg.OperationalError:
            raise
        except Exception as exc:
            if len(items) == 1:
                self._bury(conn, token_of(items[0]), exc)
                return []
            log.warning("a report of %d tasks was refused (%s); one at a time", len(items), exc)
        results: list[Any] = []
        for item in items:
            try:
                result = db.run(conn, op([item]))
            except psycopg.OperationalError:
                raise
            except Exception as exc:
                self._bury(conn, token_of(item), exc)
            else:
                if isinstance(result, set | list | dict):
                    results.extend(result)
        return results

    def _bury(
        self, conn: psycopg.Connection[Any], token: tuple[uuid.UUID, int], error: Exception
    ) -> None:
        """A task whose report the database refuses: dead, with the reason."""
        reason = f"its outcome could not be stored: {describe(error)}"
        log.error("task %s: %s", token[0], reason)
        try:
            db.run(conn, ops.fail([ops.Failure(*token, reason, final=True)]))
        except psycopg.OperationalError:
            raise
        except Exception as exc:
            # Left to its lease: when it expires the task is requeued, and dead
            # once out of attempts.
            log.error("task %s could not be marked dead either: %s", token[0], describe(exc))

    # -- helpers -----------------------------------------------------------------

    def _listen(self, queues: list[str]) -> None:
        """Wakes the claim loop on NOTIFY; after a lost connection it listens
        again once reconnected (the loop polls meanwhile)."""
        wanted = set(queues)
        outage = Outage("PostgreSQL (LISTEN)", log)
        while not self.stopping.is_set():
            try:
                with db.connect(
                    self.settings.database_url,
                    connect_timeout=self.settings.database_timeout_seconds,
                ) as conn:
                    conn.execute(query("listen_ready"))
                    outage.recovered()
                    while not self.stopping.is_set():
                        for note in conn.notifies(timeout=1.0):
                            if note.payload in wanted:
                                self.wake.set()
            except RECONNECT_ERRORS as exc:
                self.stopping.wait(outage.failed(exc))

    def _heartbeat(self) -> None:
        """Extends leases and keeps the worker's row alive; runs the
        maintenance duties while this worker holds their lock, which lives on
        this thread's connection: leadership is lost with it."""
        leadership = (
            Leadership(Maintenance(self.settings, self.app), f"worker {self.id}")
            if self.run_maintenance
            else None
        )
        last_beat = float("-inf")
        outage = Outage("PostgreSQL (heartbeat and maintenance)", log)
        conn: psycopg.Connection[Any] | None = None
        while not self.stopping.is_set():
            try:
                if conn is None:
                    conn = db.connect(
                        self.settings.database_url,
                        connect_timeout=self.settings.database_timeout_seconds,
                        # Which worker holds the maintenance lock, in pg_stat_activity.
                        application_name=f"rota-worker:{self.id}"[-63:],
                    )
                if time.monotonic() - last_beat >= self.settings.heartbeat_seconds:
                    self._beat(conn)
                    last_beat = time.monotonic()
                outage.recovered()
                if leadership is not None:
                    leadership.tick(conn)
            except RECONNECT_ERRORS as exc:
                if conn is not None:
                    conn.close()
                conn = None
                if leadership is not None:
                    leadership.connection_lost()
                self.stopping.wait(outage.failed(exc))
                continue
            except Exception:
                log.exception("heartbeat or maintenance failed; carrying on")
            self.stopping.wait(self.settings.maintenance_seconds)
        if conn is not None:
            conn.close()

    def _beat(self, conn: psycopg.Connection[Any]) -> None:
        beat_started = time.monotonic()
        if not db.run(conn, ops.worker_heartbeat(self.id)):
            log.error("worker %s was declared dead; stopping", self.id)
            self.stop()
        tokens = [f.task.token for f in list(self.in_flight.values())]
        held = (
            db.run(conn, ops.extend_leases(tokens, self.settings.lease_seconds))
            if tokens
            else set()
        )
        self.last_heartbeat = beat_started
        # Only tasks still in flight count: one that finished meanwhile left
        # the running table without losing anything.
        lost = [t for t, _ in tokens if t not in held and t in self.in_flight]
        if lost:
            log.warning("%d lease(s) lost: their results will be refused", len(lost))


def _retry_failure(task: ops.ClaimedTask, retry: Retry) -> ops.Failure:
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
    return ops.Failure(task.id, task.attempt, reason[:4000], retry_at)


def spawn_workers(
    app_spec: str,
    queues: Sequence[str],
    count: int,
    settings: Settings,
    *,
    concurrency: int = 8,
    batch_size: int = 10,
    poll_seconds: float = 1.0,
) -> list[subprocess.Popen[bytes]]:
    """Starts `count` `rota worker` processes against `settings`' servers (for the
    demo and the benchmarks; in production, run `rota worker` under your supervisor)."""
    env = {
        **os.environ,
        "ROTA_DATABASE_URL": settings.database_url,
        "ROTA_REDIS_URL": settings.redis_url,
        "ROTA_POLL_SECONDS": str(poll_seconds),
    }
    command = [
        sys.executable,
        "-m",
        "rota",
        "worker",
        "--app",
        app_spec,
        "--queues",
        ",".join(queues),
        "--concurrency",
        str(concurrency),
        "--batch-size",
        str(batch_size),
    ]
    return [
        subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(count)
    ]


def stop_workers(workers: Sequence[subprocess.Popen[bytes]], timeout: float = 60) -> None:
    """SIGTERM (graceful), then wait for each."""
    for process in workers:
        process.terminate()
    for process in workers:
        process.wait(timeout=timeout)
