"""Worker processes for the demo and the benchmarks (in production, run
`rota worker` under your supervisor)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

from rota.settings import Settings


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
    """Starts `count` `rota worker` processes against `settings`' servers."""
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
