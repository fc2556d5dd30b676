"""The one reconnect policy: backoff with jitter, one log line per outage edge."""

from __future__ import annotations

import logging

import pytest

from rota.runtime.outage import Outage, retrying


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    outage = Outage("db", logging.getLogger("t"), base=0.1, cap=2.0, jitter=lambda: 1.0)
    delays = [outage.failed(OSError("down")) for _ in range(8)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    low = Outage("db", logging.getLogger("t"), base=0.1, cap=2.0, jitter=lambda: 0.0)
    assert low.failed(OSError()) == pytest.approx(0.05)  # half fixed, half random


def test_an_outage_is_logged_when_it_starts_and_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    outage = Outage("PostgreSQL (claims)", logging.getLogger("t"), clock=clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(50):
            clock.now += 1
            outage.failed(OSError("connection refused"))
        assert outage.down and outage.down_for() == 49
        outage.recovered()
        outage.recovered()  # a success while up says nothing
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "PostgreSQL (claims) unavailable" in lines[0] and "connection refused" in lines[0]
    assert "reachable again after 49.0 s (50 attempts)" in lines[1]
    assert not outage.down and outage.attempts == 0


def test_retrying_gives_up_when_asked_or_past_its_deadline() -> None:
    calls = []

    def attempt() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("not yet")
        return "connected"

    outage = Outage("x", logging.getLogger("t"), jitter=lambda: 0.0)
    assert retrying(attempt, outage, (ConnectionError,), lambda s: False) == "connected"
    assert len(calls) == 3 and not outage.down
    stopped = retrying(lambda: 1 / 0, outage, (ZeroDivisionError,), lambda s: True)
    assert stopped is None  # a stop was asked for while waiting
    past = retrying(lambda: 1 / 0, outage, (ZeroDivisionError,), lambda s: False, deadline=0.0)
    assert past is None
