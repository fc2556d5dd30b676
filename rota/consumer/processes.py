"""The process pool (`rota worker --pool processes`): sync tasks run in child
processes, so CPU-bound tasks use every core.

Each task thread of the worker hands an idle child one task at a time over
a pipe. The children are forked from a fork server that imported
the app once (fast to replace, and never a copy of the worker's threads,
locks or connections). A run past its task's `timeout` (the hard limit) is
killed with its child; `soft_timeout` raises SoftTimeLimitExceeded in the
task first. A cancel kills the child too. A child that dies (kill -9, a
segfault, the OOM killer) fails its task with that reason; the next task
gets a new child.
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
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from rota.consumer.reports import TRACEBACK_MAX, ChildFailure, describe, full_traceback
from rota.core import ClaimedTask
from rota.errors import Cancelled, Retry, SoftTimeLimitExceeded
from rota.runtime import tracing
from rota.runtime.current import CancelFlag, current_cancel, current_task
from rota.runtime.process import load_object

if TYPE_CHECKING:
    from rota.app import App

log = logging.getLogger("rota.worker")


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


def serve(conn: multiprocessing.connection.Connection, spec: str, worker: int) -> None:
    """A child's loop: one task per message until the pipe closes."""
    _end_with(worker)
    # Signals to the process group are the worker's: it ends its children itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, _soft_limit)
    # The worker checked that `spec` names its App (spec_of, or rota.app.load_app).
    app: App = load_object(spec)  # type: ignore[assignment]
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        # A context of its own per task: the trace it attaches ends with it.
        answer = contextvars.Context().run(_run_one, app, *message)
        try:
            conn.send(answer)
        except Exception as exc:  # a return value that cannot be pickled
            conn.send(("failed", f"its result cannot be sent to the worker: {describe(exc)}", ""))


def _run_one(
    app: App,
    task: ClaimedTask,
    soft: float | None,
    keep: bool,
    trace: dict[str, str] | None,
) -> tuple[Any, ...]:
    current_task.set(task)
    current_cancel.set(CancelFlag())
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
    ) -> Any:
        """Runs `task` in an idle child and returns its value (None unless
        `keep`), or raises what it raised, Cancelled after a cancel
        (`on_start` is given the kill), HardTimeLimit or ChildDied."""
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
        # Its end of the pipe closes when it dies (its process sentinel comes
        # from the fork server, which a signal to the process group may end).
        ready = multiprocessing.connection.wait([child.conn], timeout)
        if child.conn in ready:
            try:
                answer = child.conn.recv()
            except EOFError:
                pass  # it died as it answered
            else:
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
