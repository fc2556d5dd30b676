"""`python manage.py rota_worker`: `rota worker` for the project's app
(settings.ROTA or settings.ROTA_APP), with the same options. Every installed
app's `tasks` module is imported first, so that their tasks are known."""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from django.core.management.base import BaseCommand
from django.utils.module_loading import autodiscover_modules

from rota.consumer.main import serve_worker
from rota.contrib.django import get_app

# The worker's own defaults (`rota worker` has the same), so that the two never drift apart.
_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(serve_worker).parameters.items()
    if parameter.default is not inspect.Parameter.empty
}


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no type hints
    help = (
        "Run rota tasks (rota worker for this project's app). SIGTERM/SIGINT: stop "
        "claiming, hand back unstarted tasks, let running ones finish."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--queues", help="comma-separated (default: the app's tasks' queues)")
        parser.add_argument("--exclude", help="queues to leave alone")
        parser.add_argument("--concurrency", type=int, default=_DEFAULTS["concurrency"])
        parser.add_argument("--batch-size", type=int, default=_DEFAULTS["batch_size"])
        parser.add_argument(
            "--maintenance",
            action=argparse.BooleanOptionalAction,
            default=_DEFAULTS["maintenance"],
            help="take part in the maintenance duties",
        )
        parser.add_argument(
            "--metrics-port", type=int, help="serve /metrics, /healthz and /readyz on this port"
        )
        parser.add_argument("--metrics-host", default=_DEFAULTS["metrics_host"])
        parser.add_argument(
            "--log-level", default=_DEFAULTS["log_level"], help="debug, info, warning or error"
        )
        parser.add_argument("--log-format", default=_DEFAULTS["log_format"], help="text, or json")

    def handle(self, *args: Any, **options: Any) -> None:
        autodiscover_modules("tasks")
        serve_worker(
            get_app(),
            "rota.contrib.django:app",
            queues=[n.strip() for n in (options["queues"] or "").split(",") if n.strip()],
            exclude=[n.strip() for n in (options["exclude"] or "").split(",") if n.strip()],
            concurrency=options["concurrency"],
            batch_size=options["batch_size"],
            maintenance=options["maintenance"],
            metrics_port=options["metrics_port"],
            metrics_host=options["metrics_host"],
            log_level=options["log_level"],
            log_format=options["log_format"],
        )
