"""A worker as a process's main loop (`rota worker`, `manage.py rota_worker`):
logging, stop signals, the health endpoint, and the exit when tasks outlive
the shutdown grace."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from rota.consumer.worker import Worker
from rota.readmodel.health import serve_health
from rota.runtime import logs
from rota.runtime.process import on_stop_signals, tune_gc

if TYPE_CHECKING:
    from rota.app import App


def serve_worker(
    app: App,
    app_spec: str | None,
    *,
    queues: list[str] | None = None,
    exclude: list[str] | None = None,
    concurrency: int = 4,
    batch_size: int = 10,
    pool: str = "threads",
    maintenance: bool = True,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    log_level: str = "info",
    log_format: str = "text",
) -> None:
    """Runs `app`'s tasks until SIGTERM/SIGINT: then stops claiming, hands
    back unstarted tasks, lets running ones finish within
    ROTA_SHUTDOWN_GRACE_SECONDS. `app_spec` (package.module:app) is how the
    process pool's children import the app."""
    tune_gc()
    logs.configure(log_level, log_format)
    runner = Worker(
        app,
        queues=queues or None,
        exclude=exclude or [],
        concurrency=concurrency,
        batch_size=batch_size,
        maintenance=maintenance,
        pool=pool,
        app_spec=app_spec,
    )
    on_stop_signals(runner.stop)
    if metrics_port is not None:
        serve_health(
            runner.settings, metrics_host, metrics_port, runner.ready, runner.metrics.registry
        )
    if not runner.run():
        # Tasks outlived the shutdown grace and were handed back; their
        # threads cannot be stopped, and would keep the process alive.
        logging.shutdown()
        os._exit(0)
