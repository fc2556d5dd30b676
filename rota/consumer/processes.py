"""The process pool (`rota worker --pool processes`): sync tasks run in child
processes, so CPU-bound tasks use every core.

Each task thread of the worker hands an idle child one task at a time over
a pipe. The children are forked from a fork server that imported
the app once (fast to replace, and never a copy of the worker's threads,
locks or connections). A run past its task's `timeout` (the hard limit) is
killed with its child; `soft_timeout` raises SoftTimeLimitExceeded in the
task first. A cancel kills the child too. A child that dies (kill -9, a
segfault, the OOM killer) fails its task with that reason; the next task
gets a new child. A child sends its task's latest progress to the worker
over the same pipe, at most every PROGRESS_SEND_SECONDS, and the last before
its answer.
"""

from __future__ import annotations

import contextvars
import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from rota.consumer.reports import TRACEBACK_MAX, ChildFailure, describe, full_traceback
from rota.core import ClaimedTask
from rota.errors import Cancelled, Retry, SoftTimeLimitExceeded
from rota.model.progress import Values
from rota.runtime import tracing
from rota.runtime.current import CancelFlag, current_cancel, current_task
from rota.runtime.process import load_object
from rota.runtime.progress import ProgressSlot, current_progress

if TYPE_CHECKING:
    from rota.app import App

log = logging.getLogger("rota.worker")

# A child sends its task's progress to the worker at most this often (the
# worker stores it at most about once a second).
PROGRESS_SEND_SECONDS = 0.25


class ChildDied(Exception):
    """The task's process ended without an answer (killed, crashed, out of memory)."""


class HardTimeLimit(Exception):
    """The task ran past its `timeout` and its process was killed."""


def spec_of(app: App) -> str:
    """`module:attribute` under which the children import `app`: the module
    of one of its tasks, where the app is a global."""
    for registered in app.tasks.values():
        module = sys.modules.get(registered.fn.__module__)
        if module is None or module.__name__ == "__main__":
            continue
        for attribute, value in vars(module).items():
            if value is app:
                return f"{module.__name__}:{attribute}"
    raise ValueError(
        "the process pool imports the app in its children, and found no module that "
        "holds it as a global: define the app in an importable module (not a script "
        "run as __main__), or give its package.module:app"
    )


# -- in the child ------------------------------------------------------------


def _soft_limit(_signum: int, _frame: Any) -> None:
    raise SoftTimeLimitExceeded("the task ran past its soft_timeout")


def _answer(error: BaseException) -> tuple[Any, ...]:
    """A task's exception as plain values the pipe carries whatever it is
    (an exception's pickling can fail or lose its fields)."""
    if isinstance(error, Retry):
        return ("retry", error.countdown, error.reason)
    if isinstance(error, Cancelled):
        return ("cancelled", str(error))
    return ("failed", describe(error), full_traceback(error))


def _end_with(worker: int) -> None:
    """Ends this child when the worker ends, kill -9 included, even in the
    middle of a task (the fork server, its parent, outlives the worker
    until its children are gone)."""
    try:
        watched = os.pidfd_open(worker)
    except OSError:  # already gone
        os._exit(1)

    def watch() -> None:
        select.select([watched], [], [])
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="rota-worker-watch").start()


class _PipeProgress(ProgressSlot):
    """A child's slot: its first report after each send wakes the sender."""

    __slots__ = ("closed", "pending", "sender")

    def __init__(self, token: tuple[Any, int], sender: _Sender) -> None:
        super().__init__(token, None)
        self.sender = sender
        self.pending = False
        self.closed = False  # the task answered: nothing more is sent for it

    def report(self, values: Values) -> None:
        self.latest = values
        if not self.pending:
            self.pending = True
            self.sender.due(self)


class _Sender:
    """Writes a child's messages to the worker: its task's progress (from a
    thread, at most every PROGRESS_SEND_SECONDS), then its answer."""

    def __init__(self, conn: multiprocessing.connection.Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()
        self._due = threading.Event()
        self._slot: _PipeProgress | None = None
        self._thread: threading.Thread | None = None

    def due(self, slot: _PipeProgress) -> None:
        self._slot = slot
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="rota-progress")
            self._thread.start()
        self._due.set()

    def _run(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            slot = self._slot
            if slot is not None:
                self.send_progress(slot)
            time.sleep(PROGRESS_SEND_SECONDS)

    def send_progress(self, slot: _PipeProgress) -> None:
        with self._lock:
            if slot.closed:
                return
            slot.pending = False  # first: a report after this wakes the sender again
            values = slot.latest
            if values is not None and values is not slot.stored:
                self.conn.send(("progress", slot.token[0], values))
                slot.stored = values

    def answer(self, slot: _PipeProgress | None, answer: tuple[Any, ...]) -> None:
        """The task's last progress, then its answer."""
        if slot is not None:
            self.send_progress(slot)
            slot.closed = True
        with self._lock:
            try:
                self.conn.send(answer)
            except Exception as exc:  # a return value that cannot be pickled
                failed = f"its result cannot be sent to the worker: {describe(exc)}"
                self.conn.send(("failed", failed, ""))


def serve(conn: multiprocessing.connection.Connection, spec: str, worker: int) -> None:
    """A child's loop: one task per message until the pipe closes."""
    _end_with(worker)
    # Signals to the process group are the worker's: it ends its children itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, _soft_limit)
    # The worker checked that `spec` names its App (spec_of, or rota.app.load_app).
    app: App = load_object(spec)  # type: ignore[assignment]
    sender = _Sender(conn)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        task: ClaimedTask = message[0]
        progress = _PipeProgress(task.token, sender)
        # A context of its own per task: the trace it attaches ends with it.
        answer = contextvars.Context().run(_run_one, app, progress, *message)
        sender.answer(progress, answer)


def _run_one(
    app: App,
    progress: ProgressSlot,
    task: ClaimedTask,
    soft: float | None,
    keep: bool,
    trace: dict[str, str] | None,
) -> tuple[Any, ...]:
    current_task.set(task)
    current_cancel.set(CancelFlag())
    current_progress.set(progress)
    tracing.attach(trace)
    try:
        if soft is not None:
            signal.setitimer(signal.ITIMER_REAL, soft)
        try:
            value = app.tasks[task.name].fn(*task.args, **task.kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return ("ok", value if keep else None)
    except BaseException as exc:  # SystemExit too: the child carries on
        return _answer(exc)


# -- in the worker -----------------------------------------------------------


class Child:
    """One child process and its end of the pipe."""

    def __init__(self, context: Any, spec: str) -> None:
        self.conn, theirs = multiprocessing.Pipe()
        self.process: BaseProcess = context.Process(
            target=serve, args=(theirs, spec, os.getpid()), daemon=True, name="rota-task-process"
        )
        self.process.start()
        theirs.close()

    def kill(self) -> None:
        if self.process.exitcode is None:
            self.process.kill()

    def close(self) -> None:
        self.conn.close()
        self.process.join(timeout=1)
        self.kill()

    def how_it_died(self) -> str:
        self.process.join(timeout=1)
        code = self.process.exitcode
        if code is not None and code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exited with code {code}" if code is not None else "stopped answering"


class Children:
    """The worker's children: each runs one task at a time; started before
    the worker claims, replaced after one is killed or dies."""

    def __init__(self, app: App, spec: str | None) -> None:
        self.spec = spec or spec_of(app)
        self._context = multiprocessing.get_context("forkserver")
        # The fork server imports rota and the app once; each child is a fork of it.
        # (__main__ too, else every child imports it again: a script's
        # unguarded code runs in the fork server once, as multiprocessing says.)
        preload = ["__main__", "rota.consumer.processes", self.spec.split(":")[0]]
        self._context.set_forkserver_preload(preload)
        self._idle: queue.SimpleQueue[Child] = queue.SimpleQueue()
        self._all: set[Child] = set()
        self._killed: list[Child] = []
        self._lock = threading.Lock()

    def start(self, count: int) -> None:
        """Starts `count` children, so that no task waits for one."""
        for _ in range(count):
            self._idle.put(self._start())

    def run(
        self,
        task: ClaimedTask,
        timeout: float | None,
        soft_timeout: float | None,
        keep: bool,
        cancel: CancelFlag,
        on_start: Callable[[Callable[[], None]], None],
        progress: ProgressSlot | None = None,
    ) -> Any:
        """Runs `task` in an idle child and returns its value (None unless
        `keep`), or raises what it raised, Cancelled after a cancel
        (`on_start` is given the kill), HardTimeLimit or ChildDied. The
        progress the child sends goes to `progress`."""
        try:
            child = self._idle.get_nowait()
        except queue.Empty:
            child = self._start()
        if child.conn.poll():  # an idle child's pipe reads only at its end: it died
            child.kill()
            self._forget(child)
            child = self._start()
        on_start(child.kill)
        if cancel.asked:  # asked as it started, before the kill could reach it
            self._idle.put(child)
            raise Cancelled(f"task {task.id} was cancelled as it started")
        child.conn.send((task, soft_timeout, keep, tracing.current()))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            # Its end of the pipe closes when it dies (its process sentinel comes
            # from the fork server, which a signal to the process group may end).
            ready = multiprocessing.connection.wait([child.conn], left)
            if child.conn not in ready:
                break
            try:
                answer = child.conn.recv()
            except EOFError:
                break  # it died as it answered
            if answer[0] == "progress":
                if progress is not None and answer[1] == task.id:
                    progress.report(answer[2])
                continue
            self._idle.put(child)
            return _raise_or_return(answer)
        child.kill()
        died = "" if cancel.asked or not ready else child.how_it_died()
        self._forget(child)
        if cancel.asked:
            raise Cancelled(f"task {task.id} was cancelled while it ran (its process was killed)")
        if not ready:
            raise HardTimeLimit(f"killed at its hard time limit (timeout) of {timeout:g} s")
        raise ChildDied(f"the task's process died: {died}")

    def _start(self) -> Child:
        child = Child(self._context, self.spec)
        with self._lock:
            self._all.add(child)
            # Reaps the children killed before (their exit status read).
            self._killed = [k for k in self._killed if k.process.exitcode is None]
        return child

    def _forget(self, child: Child) -> None:
        """Drops a killed child without waiting for it to be reaped: its
        task's end is reported first."""
        child.conn.close()
        with self._lock:
            self._all.discard(child)
            self._killed.append(child)

    def close(self) -> None:
        """Ends every child (a running task's included: the worker exits)."""
        with self._lock:
            children, self._all, self._killed = [*self._all, *self._killed], set(), []
        for child in children:
            child.kill()
            child.close()


def _raise_or_return(answer: tuple[Any, ...]) -> Any:
    kind = answer[0]
    if kind == "ok":
        return answer[1]
    if kind == "retry":
        raise Retry(answer[1], answer[2])
    if kind == "cancelled":
        raise Cancelled(answer[1])
    raise ChildFailure(answer[1], answer[2][-TRACEBACK_MAX:])
