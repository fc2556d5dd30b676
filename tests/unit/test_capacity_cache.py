"""The producer's capacity cache: PostgreSQL down costs no enqueue a round trip."""

from __future__ import annotations

import logging

import pytest

from rota import App, Settings
from rota.producer.core import FetchBacklogs, ProducerCore, WriteBuffer


def test_a_failed_refresh_is_not_retried_before_the_cache_is_due(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(capacity_cache_seconds=30)
    app = App(settings)
    batch = app.batch([app.prepare("x.y", queue="q", tenant="alice")])
    core = ProducerCore(settings)

    first = core.store(batch)
    assert isinstance(next(first), FetchBacklogs)
    with caplog.at_level(logging.WARNING):
        assert isinstance(first.throw(ConnectionError("database down")), WriteBuffer)
    first.close()

    second = core.store(batch)
    assert isinstance(next(second), WriteBuffer)  # straight to the buffer
    second.close()
    assert [r.message for r in caplog.records if "capacities" in r.message] == [
        "could not refresh tenant capacities, using the cached ones for 30.0 s: database down"
    ]


def test_the_refresh_is_tried_again_once_due() -> None:
    settings = Settings(capacity_cache_seconds=0)
    app = App(settings)
    batch = app.batch([app.prepare("x.y", queue="q", tenant="alice")])
    core = ProducerCore(settings)
    for _ in range(2):
        flow = core.store(batch)
        assert isinstance(next(flow), FetchBacklogs)
        flow.throw(ConnectionError("database down"))
        flow.close()
