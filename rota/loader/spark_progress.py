"""Progress of a Spark job on the driver: the executors add to accumulators
(for progress only: a retried Spark task adds again), and a driver thread
reads them every PROGRESS_SECONDS and reports what changed, until the job
ends. Shared by `rota import` and `rota archive`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

PROGRESS_SECONDS = 0.5
T = TypeVar("T")


@contextmanager
def reporting(read: Callable[[], T], report: Callable[[T], None] | None) -> Iterator[None]:
    """Reports `read()` each time it changes while the block runs, and once
    more at its end; nothing without `report`."""
    if report is None:
        yield
        return
    finished = threading.Event()

    def watch() -> None:
        seen: T | None = None
        while True:
            done = finished.wait(PROGRESS_SECONDS)
            now = read()
            if now != seen:
                report(now)
                seen = now
            if done:
                return

    watcher = threading.Thread(target=watch, name="rota-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        finished.set()
        watcher.join()
