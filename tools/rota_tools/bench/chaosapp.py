"""The app `rota bench chaos` runs workers with: each run of a task appends
one line (task id, tenant, attempt, pid, start, end) to a file of its own
process under ROTA_CHAOS_RUNS, so runs are recorded whatever the servers do;
runs of the task under a limit on keys also to a file of their own."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import rota

app = rota.App.from_env()
_lock = threading.Lock()


# A downstream that every tenant shares: at most KEY_LIMIT of its runs at once.
KEY_LIMIT = 3


def _runs_file(kind: str = "runs") -> Path:
    return Path(os.environ["ROTA_CHAOS_RUNS"]) / f"{kind}-{os.getpid()}.log"


def _record(started: float, *kinds: str) -> None:
    task = rota.context()
    line = f"{task.id} {task.tenant} {task.attempt} {os.getpid()} {started:.6f} {time.time():.6f}\n"
    with _lock:
        for kind in kinds:
            with _runs_file(kind).open("a") as runs:
                runs.write(line)


@app.task(queue="chaos", max_attempts=100, backoff=0.05, backoff_max=1.0)
def work(seconds: float) -> None:
    started = time.time()
    time.sleep(seconds)
    _record(started, "runs")


@app.task(
    queue="chaos",
    max_attempts=100,
    backoff=0.05,
    backoff_max=1.0,
    limit=rota.Limit("downstream", concurrency=KEY_LIMIT),
)
def keyed_work(seconds: float) -> None:
    started = time.time()
    time.sleep(seconds)
    _record(started, "runs", "keyed")
