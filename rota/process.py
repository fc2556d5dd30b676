"""Set-up for rota's own long-running processes: loaders, workers, the Spark driver."""

from __future__ import annotations

import gc


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
