"""Worker and loader processes for the demo and the benchmarks (in
production, run `rota worker` and `rota loader run` under your supervisor)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

from rota.settings import Settings


def _env(settings: Settings, poll_seconds: float = 1.0) -> dict[str, str]:
    env = {
        **os.environ,
        "ROTA_DATABASE_URL": settings.database_url,
        "ROTA_DATABASE_POOLING": settings.database_pooling,
        "ROTA_REDIS_URL": settings.redis_url,
        "ROTA_POLL_SECONDS": str(poll_seconds),
        "ROTA_WORKER_SYNCHRONOUS_COMMIT": str(settings.worker_synchronous_commit).lower(),
    }
    env.pop("ROTA_DIRECT_DATABASE_URL", None)
    if settings.direct_database_url is not None:
        env["ROTA_DIRECT_DATABASE_URL"] = settings.direct_database_url
    return env


def _start(arguments: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "rota", *arguments],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def spawn_workers(
    app_spec: str,
    queues: Sequence[str],
    count: int,
    settings: Settings,
    *,
    concurrency: int = 8,
    batch_size: int = 10,
    poll_seconds: float = 1.0,
    pool: str = "threads",
) -> list[subprocess.Popen[bytes]]:
    """Starts `count` `rota worker` processes against `settings`' servers."""
    arguments = ["worker", "--app", app_spec, "--queues", ",".join(queues), "--pool", pool]
    arguments += ["--concurrency", str(concurrency), "--batch-size", str(batch_size)]
    env = _env(settings, poll_seconds)
    return [_start(arguments, env) for _ in range(count)]


def spawn_loader(settings: Settings, engine: str = "python") -> subprocess.Popen[bytes]:
    """Starts a long-running `rota loader run` against `settings`' servers."""
    return _start(["loader", "run", "--engine", engine], _env(settings))


def spawn_console(settings: Settings, port: int, token: str) -> subprocess.Popen[bytes]:
    """Starts `rota dashboard` on `port` against `settings`' servers, its API
    and pages behind `token`."""
    env = {**_env(settings), "ROTA_DASHBOARD_TOKEN": token}
    return _start(["dashboard", "--port", str(port), "--log-level", "warning"], env)


def stop_workers(workers: Sequence[subprocess.Popen[bytes]], timeout: float = 60) -> None:
    """SIGTERM (graceful), then wait for each (workers or loaders)."""
    for process in workers:
        process.terminate()
    for process in workers:
        process.wait(timeout=timeout)
