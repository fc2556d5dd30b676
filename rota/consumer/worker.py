"""The worker: claims tasks in fair order, runs them, reports in batches.

Threads, each with its own connection:
  - the main loop claims up to the free slots, hands tasks to a thread pool
    (sync tasks) or an event loop (async tasks), and completes or fails the
    finished ones in batches;
  - a listener wakes the main loop on NOTIFY (one per loaded batch), with a
    jittered polling fallback so a fleet does not stampede;
  - a heartbeat extends the leases of running tasks, keeps the worker's row
    alive, stores progress, and runs maintenance while it holds their lock.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import psycopg

from rota import core
from rota.consumer.heartbeat import beat, heartbeat
from rota.consumer.maintenance import Leadership, Maintenance
from rota.consumer.processes import Children
from rota.consumer.progress import ProgressFlush
from rota.consumer.reports import (
    UnknownTaskPolicy,
    Unreported,
    complete_and_claim,
    completes_alone,
    report,
    unreadable_claim,
)
from rota.consumer.running import (
    Attempt,
    InFlight,
    Outcome,
    StaleClaim,
    TaskPool,
    apply_cancels,
    call_sync,
    expire_timeouts,
    listen,
    run_async,
    sort_outcome,
    worker_queues,
)
from rota.core import connections, db, versions
from rota.readmodel.metrics import WorkerMetrics
from rota.runtime.outage import Kept, Outage, run_rounds, run_until_done

if TYPE_CHECKING:
    from rota.app import App
    from rota.task import Task

log = logging.getLogger("rota.worker")

# Busy: how long finished tasks may gather, so that completing and claiming
# stay batches rather than a round trip per task.
GATHER_SECONDS = 0.005
# Caught up: the poll interval is jittered, so a fleet does not poll in step.
POLL_JITTER = (0.5, 1.5)
# Shutting down: how often finished tasks are collected within the grace.
SHUTDOWN_CHECK_SECONDS = 0.05


class Worker:
    def __init__(
        self,
        app: App,
        queues: Sequence[str] | None = None,
        exclude: Sequence[str] = (),
        concurrency: int = 4,
        batch_size: int = 10,
        maintenance: bool = True,
        pool: str = "threads",
        app_spec: str | None = None,
    ) -> None:
        """`pool="processes"` runs sync tasks in child processes, which import
        the app by `app_spec` (package.module:app; found when left out)."""
        self.app = app
        self.settings = app.settings
        self.fixed_queues = list(queues) if queues else None
        self.exclude = set(exclude)
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.run_maintenance = maintenance
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # Its claims and reports carry it: a worker role acts for itself only.
        self.key = core.WorkerKey.new(self.id)
        self.stopping = threading.Event()
        self.exited = threading.Event()  # cancels still reach a worker that is stopping
        self.cancels: collections.deque[uuid.UUID] = collections.deque()
        self.wake = threading.Event()
        self.in_flight: dict[uuid.UUID, InFlight] = {}
        # The tasks' progress, stored by the heartbeat thread (rota.consumer.progress).
        self.progress = ProgressFlush(self.key, self.in_flight)
        # Finished tasks, appended by the task threads and the event loop and
        # popped by the claim loop: a deque's append and popleft are atomic,
        # with no lock and condition per task as queue.Queue takes.
        self.outcomes: collections.deque[Outcome] = collections.deque()
        self.processed = 0
        self.unreported = Unreported()  # taken off `outcomes`, not yet stored
        self.unknown_tasks = UnknownTaskPolicy(
            self.settings.unknown_task_retry_seconds, self.settings.unknown_task_grace_seconds
        )
        # After a claim that could not be read: claims of one task, this many
        # times, to find the task that caused it.
        self.narrowing = 0
        self.claims_outage = Outage("PostgreSQL (claims and reports)", log)
        self.metrics = WorkerMetrics(self.settings.metrics_tenants)
        self._queue_of_failed: dict[uuid.UUID, str] = {}
        # (queue, tenant) -> (runs, seconds) since the last heartbeat; the
        # heartbeat takes the dict whole (a run added to it as it is taken is
        # lost, which a mean of many runs does not feel).
        self.run_times: dict[tuple[str, str], tuple[int, float]] = {}
        # When the claim loop last went round (readiness: it is claiming).
        self.last_step = time.monotonic()
        self._pool = TaskPool(concurrency, "rota-task")
        if pool not in ("threads", "processes"):
            raise ValueError(f"the pool is threads or processes, not {pool!r}")
        self._children = Children(app, app_spec) if pool == "processes" else None
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
        queues = worker_queues(self.app, self.fixed_queues, self.exclude)
        conn = run_until_done(
            lambda: self._join(queues), self.claims_outage, db.SERVER_LOST, self.stopping.wait
        )
        if conn is None:
            return True  # stopped before the database came back
        self._loop_thread.start()
        if self._children is not None:
            self._children.start(self.concurrency)
        helpers = [
            threading.Thread(
                target=listen,
                args=(self.settings, queues, self.wake, self.exited, self.cancel_asked, self.id),
                daemon=True,
            ),
            threading.Thread(target=self._heartbeat, daemon=True),
        ]
        for helper in helpers:
            helper.start()
        log.info("worker %s on queues %s, concurrency %d", self.id, queues, self.concurrency)
        kept = Kept(self._connect)
        kept.current = conn
        try:
            # An outage keeps the outcomes not yet reported, to report after
            # reconnecting. Other failures are narrowed down to their task
            # where they can be (claims and reports); anything else is logged.
            run_rounds(
                lambda: self._step(kept.get(), queues),
                self.claims_outage,
                db.SERVER_LOST,
                self.stopping,
                lost=kept.drop,
                carry_on="worker step",
                pause_after_crash=self.settings.poll_seconds,
            )
            return self._shutdown(kept.current)
        finally:
            self.stopping.set()
            self.exited.set()
            self._pool.shutdown()
            if self._children is not None:
                self._children.close()  # what still runs was handed back
            self._loop.call_soon_threadsafe(self._loop.stop)
            kept.drop()

    def _connect(self) -> psycopg.Connection[Any]:
        """The connection that claims and reports, once the database's schema
        is one this worker runs on (rota.core.versions)."""
        return versions.ready(connections.connect(self.settings, "claims"), self.stopping.is_set)

    def _join(self, queues: list[str]) -> psycopg.Connection[Any]:
        """Connects, registers the worker and declares the app's limits on keys
        (rota.Limit): all of it again after a lost server, as each statement
        may be repeated."""
        conn = self._connect()
        try:
            host, beat = socket.gethostname(), self.settings.heartbeat_seconds
            db.run(
                conn,
                core.register_worker(self.key, host, os.getpid(), queues, self.concurrency, beat),
            )
            limits = [t.options.limit for t in self.app.tasks.values() if t.options.limit]
            if limits:
                declared = db.run(conn, core.declare_limits(limits, f"worker {self.id}"))
                if declared:
                    log.info("limits on keys declared: %s", ", ".join(declared))
        except BaseException:
            conn.close()
            raise
        return conn

    def _step(self, conn: psycopg.Connection[Any], queues: list[str]) -> None:
        """Reports what finished, then claims what fits; waits when there is nothing to do."""
        self.last_step = time.monotonic()
        self._apply_cancels()
        self._collect_outcomes()
        expire_timeouts(self.in_flight.values(), self.outcomes)
        # Up to one batch beyond the running tasks is prefetched.
        free = self.concurrency + self.batch_size - len(self.in_flight)
        wanted = min(self.batch_size, free)
        if self.in_flight and wanted < max(1, self.batch_size // 2):
            self._report(conn)
            self.wake.wait(GATHER_SECONDS)
            self.wake.clear()
            return
        if self.narrowing:
            wanted = 1
        # The leases begin at the server's clock before the answer is back:
        # counted from before the claim was sent, never from after.
        sent = time.monotonic()
        try:
            claimed = self._claim(conn, queues, wanted)
        except db.SERVER_LOST:
            raise
        except Exception as exc:
            # Completions sent with a refused claim are still held, and not
            # what it took. At least one step apart follows: they are reported
            # on their own, narrowed down if need be.
            done = [*self.unreported.done, *(k.token for k in self.unreported.kept)]
            in_hand = {*self.in_flight, *(task_id for task_id, _ in done)}
            self.narrowing = max(1, db.run(conn, unreadable_claim(self.key, in_hand, exc)))
            return
        if self.narrowing:
            self.narrowing -= 1
        for name, n in collections.Counter(task.queue for task in claimed).items():
            self.metrics.claimed.labels(name).inc(n)
        for task in claimed:
            self._start(task, sent)
        if len(claimed) < wanted:
            # Caught up: wait for a NOTIFY, a finished task, or the poll.
            self.wake.wait(self.settings.poll_seconds * random.uniform(*POLL_JITTER))
            self.wake.clear()

    def _shutdown(self, conn: psycopg.Connection[Any] | None) -> bool:
        """Hands back unstarted tasks at once, lets running ones finish within
        the grace, then hands back what still runs; returns whether all ended."""
        deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        with self._pool.starting:
            unstarted = [
                f.task.token
                for f in list(self.in_flight.values())
                if f.started_at is None and f.hand_back()
            ]
        for task_id, _ in unstarted:
            self.in_flight.pop(task_id, None)
        while self.in_flight and time.monotonic() < deadline:
            self.wake.wait(SHUTDOWN_CHECK_SECONDS)
            self.wake.clear()
            self._apply_cancels()
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
                self.progress.flush(conn, now=True)  # the ended tasks' last progress
                if unstarted or stuck:
                    db.run(conn, core.release([*unstarted, *stuck], self.key))
                db.run(conn, core.stop_worker(self.key))
                break
            except db.SERVER_LOST as exc:
                if attempt or time.monotonic() >= deadline:
                    log.warning("could not report before exiting (leases will expire): %s", exc)
                    break
                if conn is not None:
                    conn.close()
                conn = None
        return not stuck

    # -- running tasks ---------------------------------------------------------

    def _start(self, task: core.ClaimedTask, leased_from: float) -> None:
        registered = self.app.tasks.get(task.name)
        if registered is None:
            self.unreported.unknown.append(task.token)
            return
        # A child process keeps its task's time limits itself.
        timeout = None if self._children and not registered.is_async else registered.options.timeout
        # A workflow's member keeps its result for its join ("keep" seconds).
        keep, for_join = registered.options.result_ttl, False
        if "keep" in task.payload:
            keep, for_join = max(keep or 0.0, task.payload["keep"]), keep is None
        flight = InFlight(
            task, timeout=timeout, leased_from=leased_from, keep=keep, for_join=for_join
        )
        flight.progress = self.progress.slot(task.token)
        self.in_flight[task.id] = flight
        if not registered.is_async:
            # A prefetched task waits unstarted (handed back at shutdown).
            return self._pool.submit(self._run_sync, registered, flight)
        lease = self.settings.lease_seconds
        running = run_async(registered, flight, self._async_slots, lease)
        run = asyncio.run_coroutine_threadsafe(running, self._loop)
        flight.future = run
        run.add_done_callback(functools.partial(self._done, flight))

    def cancel_asked(self, task_id: uuid.UUID) -> None:
        self.cancels.append(task_id)
        self.wake.set()

    def _apply_cancels(self) -> None:
        apply_cancels(
            self.cancels, self.in_flight, self._pool.starting, self.unreported, self._ended
        )

    def _run_sync(self, registered: Task[Any, Any], flight: InFlight) -> None:
        try:
            with self._pool.starting:
                if flight.handed_back:
                    return
                if flight.lease_ran_out(self.settings.lease_seconds):
                    raise StaleClaim()
                flight.begin()
            value = call_sync(registered, flight, self._children)
        except BaseException as exc:  # as the pool's future would keep it
            self._ended(Outcome(flight.task, exc, keep=flight.keep))
        else:
            self._ended(flight.outcome(value))

    def _done(self, flight: InFlight, future: Future[Any]) -> None:
        if not future.cancelled():
            error = future.exception()
            if error is None:
                self._ended(flight.outcome(future.result()))
            else:
                self._ended(Outcome(flight.task, error, keep=flight.keep))

    def _ended(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        # Set once for many outcomes: every wait's clear() is followed by
        # collecting the outcomes, so one appended before the clear is seen.
        if not self.wake.is_set():
            self.wake.set()

    def _claim(
        self, conn: psycopg.Connection[Any], queues: list[str], wanted: int
    ) -> list[core.ClaimedTask]:
        """Reports what finished and claims up to `wanted`: completions alone
        go with the claim, in one statement and transaction."""
        lease = self.settings.lease_seconds
        if completes_alone(self.unreported) and not self.narrowing:
            together = complete_and_claim(self.unreported, queues, wanted, self.key, lease)
            finished, claimed = db.run(conn, together)
            self.processed += finished
            if claimed is not None:
                return claimed
        else:
            self._report(conn)
        return db.run(conn, core.claim(queues, wanted, self.key, lease))

    def _report(self, conn: psycopg.Connection[Any]) -> None:
        """Reports what finished since the last call, and what a lost
        connection kept from being reported."""
        self._collect_outcomes()
        if self.unreported:
            reported = report(self.unreported, self.unknown_tasks, self._observe_failure, self.key)
            self.processed += db.run(conn, reported)

    def _collect_outcomes(self) -> None:
        ran: list[Attempt] = []
        while True:
            try:
                outcome = self.outcomes.popleft()
            except IndexError:
                break
            flight = self.in_flight.pop(outcome.task.id, None)
            if flight is None:
                continue  # already reported (a timeout, then the late result)
            sort_outcome(outcome, self.unreported, self.settings.max_result_bytes)
            if flight.started_at is None:
                continue  # never started (a stale claim)
            task, failed = outcome.task, outcome.error is not None
            seconds = outcome.ended - flight.started_at
            started = flight.started_after()
            if not failed and started is not None:
                self.unreported.runs[task.id] = (started, seconds)
            ran.append(Attempt(task.queue, task.tenant, flight.waited or 0.0, seconds, failed))
            if failed:
                self._queue_of_failed[task.id] = task.queue
        if ran:
            self.metrics.attempts(ran)
            times = self.run_times
            for attempt in ran:
                runs, seconds = times.get((attempt.queue, attempt.tenant), (0, 0.0))
                times[attempt.queue, attempt.tenant] = (runs + 1, seconds + attempt.ran)

    def _observe_failure(self, outcome: core.FailOutcome) -> None:
        queue = self._queue_of_failed.pop(outcome.id, "unknown")
        self.metrics.failure_ended(queue, retried=outcome.status == "scheduled")

    def ready(self) -> bool:
        """Connected, and the claim loop going round (for /readyz)."""
        stalled_after = max(10.0, 3 * self.settings.poll_seconds)
        return (
            not self.claims_outage.down
            and not self.stopping.is_set()
            and time.monotonic() - self.last_step < stalled_after
        )

    # -- helpers -----------------------------------------------------------------

    def _heartbeat(self) -> None:
        # The maintenance lock is a session's: behind a transaction pooler the
        # heartbeat's connection has none, and `rota maintenance` leads instead.
        leads = self.run_maintenance and not self.settings.transaction_pooling
        if self.run_maintenance and not leads:
            log.info("behind a transaction pooler, workers leave maintenance to `rota maintenance`")
        leadership = (
            Leadership(Maintenance(self.settings, self.app), f"worker {self.id}") if leads else None
        )
        beating = functools.partial(beat, self)
        heartbeat(self.settings, self.id, beating, leadership, self.stopping, self.progress.flush)
