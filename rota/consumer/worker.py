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
from typing import Any

import psycopg

from rota import db, ops
from rota.consumer.maintenance import Maintenance
from rota.errors import Retry, UnknownTask
from rota.producer.app import App, Task
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
    started_at: float | None = None  # set when it really starts (not when prefetched)
    timed_out: bool = False

    def begin(self) -> None:
        self.started_at = time.monotonic()


@dataclass
class Outcome:
    task: ops.ClaimedTask
    error: BaseException | None  # None: success


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
        # Outcomes taken off `outcomes` but not yet reported: kept across a lost
        # connection and reported after reconnecting (fencing refuses any
        # whose lease went to another worker meanwhile).
        self._to_complete: list[tuple[uuid.UUID, int]] = []
        self._to_fail: list[ops.Failure] = []
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

    def run(self) -> None:
        conn = self._connect()
        queues = self._queues(conn)
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
                try:
                    self._step(conn, queues)
                except psycopg.OperationalError as exc:
                    # The database went away: outcomes not yet reported are
                    # kept and reported after reconnecting; reconnect and carry on.
                    log.warning("database unavailable, reconnecting: %s", exc)
                    time.sleep(1)
                    conn.close()
                    conn = self._connect()
            self._shutdown(conn)
        finally:
            self.stopping.set()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._loop.call_soon_threadsafe(self._loop.stop)
            conn.close()

    def _connect(self) -> psycopg.Connection[Any]:
        """The connection that claims and reports."""
        return db.connect(
            self.settings.database_url,
            synchronous_commit=self.settings.worker_synchronous_commit,
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
        claimed = db.run(conn, ops.claim(queues, wanted, self.id, self.settings.lease_seconds))
        for task in claimed:
            self._start(task)
        if len(claimed) < wanted:
            # Caught up: wait for a NOTIFY, a finished task, or the poll.
            self.wake.wait(self.settings.poll_seconds * random.uniform(0.5, 1.5))
            self.wake.clear()

    def _queues(self, conn: psycopg.Connection[Any]) -> list[str]:
        if self.fixed_queues is not None:
            names = self.fixed_queues
        else:
            known = {t.options.queue for t in self.app.tasks.values()}
            names = sorted(known | set(db.run(conn, ops.queue_names())))
        return [q for q in names if q not in self.exclude]

    def _shutdown(self, conn: psycopg.Connection[Any]) -> None:
        unstarted = [
            f.task.token
            for f in self.in_flight.values()
            if f.started_at is None and f.future.cancel()
        ]
        if unstarted:
            db.run(conn, ops.release(unstarted))
            for task_id, _ in unstarted:
                self.in_flight.pop(task_id, None)
        deadline = time.monotonic() + self.settings.shutdown_grace_seconds
        while self.in_flight and time.monotonic() < deadline:
            self._report(conn)
            time.sleep(0.01)
        self._report(conn)
        if self.in_flight:
            log.warning(
                "%d task(s) still running after the grace period; their leases "
                "will bring them back",
                len(self.in_flight),
            )
        db.run(conn, ops.stop_worker(self.id))

    # -- running tasks ---------------------------------------------------------

    def _start(self, task: ops.ClaimedTask) -> None:
        registered = self.app.tasks.get(task.name)
        flight = InFlight(task, timeout=registered.options.timeout if registered else None)
        if registered is not None and registered.is_async:
            flight.future = asyncio.run_coroutine_threadsafe(
                self._run_async(registered, flight), self._loop
            )
        else:
            # The pool runs `concurrency` at a time; a prefetched task waits in
            # its queue, unstarted (and is handed back at shutdown).
            flight.future = self._pool.submit(self._run_sync, registered, flight)
        self.in_flight[task.id] = flight
        flight.future.add_done_callback(functools.partial(self._done, task))

    @staticmethod
    def _run_sync(registered: Task[Any, Any] | None, flight: InFlight) -> Any:
        flight.begin()
        if registered is None:
            raise UnknownTask(
                f"unknown task {flight.task.name!r}: not registered in this worker's app"
            )
        current_task.set(flight.task)
        return registered.fn(*flight.task.args, **flight.task.kwargs)

    async def _run_async(self, registered: Task[Any, Any], flight: InFlight) -> Any:
        async with self._async_slots:
            flight.begin()
            current_task.set(flight.task)
            try:
                return await asyncio.wait_for(
                    registered.fn(*flight.task.args, **flight.task.kwargs), flight.timeout
                )
            except TimeoutError:
                raise TaskTimeout(f"timed out after {flight.timeout} s") from None

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
        """Completes and fails what finished since the last call (and what a
        lost connection kept from being reported), in two statements."""
        done = self._to_complete
        failed = self._to_fail
        while True:
            try:
                outcome = self.outcomes.get_nowait()
            except queue.Empty:
                break
            if self.in_flight.pop(outcome.task.id, None) is None:
                continue  # already reported (a timeout, then the late result)
            error = outcome.error
            if error is None:
                done.append(outcome.task.token)
            elif isinstance(error, Retry):
                retry_at = (
                    datetime.now(UTC) + timedelta(seconds=error.countdown)
                    if error.countdown is not None
                    else None
                )
                failed.append(
                    ops.Failure(outcome.task.id, outcome.task.attempt, error.reason, retry_at)
                )
            else:
                failed.append(
                    ops.Failure(
                        outcome.task.id,
                        outcome.task.attempt,
                        "".join(traceback.format_exception_only(error)).strip()[:4000],
                        final=isinstance(error, UnknownTask),  # no retry can help
                    )
                )
        if done:
            completed = db.run(conn, ops.complete(done))
            if len(completed) < len(done):
                log.warning(
                    "%d completion(s) refused: lease lost, or reported before the "
                    "connection was lost",
                    len(done) - len(completed),
                )
            self.processed += len(done)
            self._to_complete = []
        if failed:
            db.run(conn, ops.fail(failed))
            self.processed += len(failed)
            self._to_fail = []

    # -- helpers -----------------------------------------------------------------

    def _listen(self, queues: list[str]) -> None:
        wanted = set(queues)
        try:
            with db.connect(self.settings.database_url) as conn:
                conn.execute(query("listen_ready"))
                while not self.stopping.is_set():
                    for note in conn.notifies(timeout=1.0):
                        if note.payload in wanted:
                            self.wake.set()
        except psycopg.Error as exc:
            log.warning("LISTEN connection lost, polling only: %s", exc)

    def _heartbeat(self) -> None:
        maintenance = Maintenance(self.settings, self.app) if self.run_maintenance else None
        leader = False
        last_beat = 0.0
        with db.connect(self.settings.database_url) as conn:
            while not self.stopping.wait(self.settings.maintenance_seconds):
                try:
                    if time.monotonic() - last_beat >= self.settings.heartbeat_seconds:
                        last_beat = time.monotonic()
                        if not db.run(conn, ops.worker_heartbeat(self.id)):
                            log.error("worker %s was declared dead; stopping", self.id)
                            self.stop()
                        tokens = [f.task.token for f in list(self.in_flight.values())]
                        if tokens:
                            held = db.run(
                                conn, ops.extend_leases(tokens, self.settings.lease_seconds)
                            )
                            if len(held) < len(tokens):
                                log.warning("%d lease(s) lost", len(tokens) - len(held))
                    if maintenance is not None:
                        leader = leader or db.run(conn, ops.try_maintenance_lock())
                        if leader:
                            maintenance.tick(conn)
                except psycopg.Error as exc:
                    log.warning("heartbeat failed: %s", exc)


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
