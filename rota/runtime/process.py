"""Set-up for rota's own long-running processes: loaders, workers, the Spark driver."""

from __future__ import annotations

import gc
import os
import signal
import threading
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def tune_gc() -> None:
    """Their batches allocate many short-lived objects (a loader's tens of
    thousands of tasks, a worker's claimed rows) and few reference cycles, so
    the collector's defaults (a young collection every 700 allocations, full
    ones that scan every live object) cost a loader about a sixth of its time.
    Objects from start-up are frozen out of full collections, and young
    collections run every 50,000 allocations. The producer SDK never calls
    this: a web app's process, and its collector, are the app's."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def on_stop_signals(callback: Callable[[], None]) -> None:
    """Calls `callback` in a thread of its own on SIGTERM or SIGINT (each time).

    Python runs a signal handler in the main thread between two bytecodes,
    perhaps while that thread holds the lock of the very Event the handler
    sets: a worker deadlocked on itself so, and never exited (1 SIGTERM in
    about 18 under load). Here the handlers do nothing; the interpreter's
    C-level handler writes the signal's number to the wakeup fd, and a thread
    that reads it calls back, free to take any lock. Call it from the main
    thread."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda *_: None)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)

    def relay() -> None:
        while received := os.read(read_end, 64):
            if any(signum in STOP_SIGNALS for signum in received):
                callback()

    threading.Thread(target=relay, name="rota-stop-signals", daemon=True).start()


def load_object(spec: str) -> object:
    """What `package.module:attribute` names (ValueError if nothing)."""
    import importlib

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"an app is named package.module:app, not {spec!r}")
    try:
        found: object = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load the app {spec!r}: {exc}") from None
    return found
