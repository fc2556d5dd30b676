"""Fixtures of the acceptance tier: real worker processes against the test servers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from rota import App, Settings
from tests.acceptance.workapp import LOG_TABLE

ROOT = Path(__file__).parent.parent.parent


@pytest.fixture
def env(settings: Settings, conn: psycopg.Connection[Any]) -> dict[str, str]:
    conn.execute(LOG_TABLE)
    return {
        **os.environ,
        "ROTA_DATABASE_URL": settings.database_url,
        "ROTA_REDIS_URL": settings.redis_url,
        "ROTA_POLL_SECONDS": "0.2",
        "ROTA_HEARTBEAT_SECONDS": "0.5",
        "ROTA_LEASE_SECONDS": "5",
        "ROTA_MAINTENANCE_SECONDS": "0.2",
        "ROTA_WORKER_DEAD_AFTER_SECONDS": "3",
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture
def producer(env: dict[str, str], settings: Settings) -> Iterator[App]:
    from tests.acceptance import workapp

    application = App(settings)
    for task in workapp.app.tasks.values():
        application.tasks[task.name] = task
    yield application
    application.close()
