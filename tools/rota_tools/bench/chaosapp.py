"""The app `rota bench chaos` runs workers with: each run of a task appends
one line (task id, tenant, attempt, pid, start, end) to a file of its own
process under ROTA_CHAOS_RUNS, so runs are recorded whatever the servers do."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import rota

app = rota.App.from_env()
_lock = threading.Lock()


def _runs_file() -> Path:
    return Path(os.environ["ROTA_CHAOS_RUNS"]) / f"runs-{os.getpid()}.log"


@app.task(queue="chaos", max_attempts=100, backoff=0.05, backoff_max=1.0)
def work(seconds: float) -> None:
    started = time.time()
    time.sleep(seconds)
    task = rota.context()
    line = f"{task.id} {task.tenant} {task.attempt} {os.getpid()} {started:.6f} {time.time():.6f}\n"
    with _lock, _runs_file().open("a") as runs:
        runs.write(line)
