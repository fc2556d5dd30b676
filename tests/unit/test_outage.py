"""The one reconnect policy: backoff with jitter, one log line per outage edge."""

from __future__ import annotations

import logging

import pytest

from rota.runtime.outage import Kept, Outage, Polled, outages, retrying, rounds


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


class FakeStop:
    """A Stop that records waits and sets itself after `rounds` waits."""

    def __init__(self, waits: int) -> None:
        self.left, self.waited = waits, []  # type: ignore[var-annotated]

    def is_set(self) -> bool:
        return self.left <= 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.append(timeout)
        self.left -= 1
        return self.is_set()


class Conn:
    made = 0

    def __init__(self) -> None:
        Conn.made += 1
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_rounds_reconnect_after_a_lost_server_and_carry_on_after_a_crash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kept: Kept[Conn] = Kept(Conn)
    script = iter(["ok", "lost", "lost", "ok", "crash", "ok"])
    held = []

    def work() -> float:
        held.append(kept.get())
        step = next(script)
        if step == "lost":
            raise ConnectionError("gone")
        if step == "crash":
            raise ValueError("a bug")
        return 5.0

    outage = Outage("db", logging.getLogger("t"), base=0.1, jitter=lambda: 1.0)
    stop = FakeStop(waits=6)
    with caplog.at_level(logging.WARNING):
        rounds(
            work,
            outage,
            (ConnectionError,),
            stop,
            lost=kept.drop,
            carry_on="x",
            pause_after_crash=7,
        )
    # ok: the interval; lost twice: the backoff; ok; the crash's pause; ok.
    assert stop.waited == [5.0, 0.1, 0.2, 5.0, 7, 5.0]
    # Kept while it works, dropped and made anew after each loss only.
    assert held[0] is held[1] and held[2] is not held[1] and held[3] is not held[2]
    assert held[3] is held[4] is held[5]
    assert held[1].closed and held[2].closed and not held[5].closed
    messages = [r.getMessage() for r in caplog.records]
    assert any("unavailable" in m for m in messages) and any("again" in m for m in messages)
    assert any(m == "x failed; carrying on" for m in messages)
    assert outages()["db"] == (1, False)


def test_rounds_without_carry_on_let_a_crash_through() -> None:
    def work() -> float:
        raise ValueError("a bug")

    outage = Outage("y", logging.getLogger("t"))
    with pytest.raises(ValueError):
        rounds(work, outage, (ConnectionError,), FakeStop(waits=3))


def test_polled_stop_waits_until_its_check_says_stop() -> None:
    checks = iter([False, False, True])
    stop = Polled(lambda: next(checks), every=0.001)
    assert stop.wait(10) is True
    assert Polled(lambda: False, every=0.001).wait(0.005) is False


def test_every_loop_that_builds_an_outage_runs_through_the_policy() -> None:
    """A module that tracks an outage also reconnects through rounds or
    retrying (the producer's breaker only logs: enqueues fall back at once)."""
    import ast
    from pathlib import Path

    import rota

    root = Path(rota.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        names = {
            node.id if isinstance(node, ast.Name) else node.attr
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Name | ast.Attribute)
        }
        relative = str(path.relative_to(root))
        exempt = relative in ("runtime/outage.py", "producer/core.py")
        if "Outage" in names and not exempt and not names & {"rounds", "retrying"}:
            offenders.append(relative)
    assert offenders == []


def test_a_process_registry_shows_its_loops_outages() -> None:
    from prometheus_client import generate_latest

    from rota.readmodel.metrics import process_registry

    outage = Outage("Redis (metrics test)", logging.getLogger("t"))
    outage.failed(ConnectionError("refused"))
    text = generate_latest(process_registry()).decode()
    assert 'rota_outages_total{loop="Redis (metrics test)"} 1.0' in text
    assert 'rota_outage_active{loop="Redis (metrics test)"} 1.0' in text
    outage.recovered()
    text = generate_latest(process_registry()).decode()
    assert 'rota_outage_active{loop="Redis (metrics test)"} 0.0' in text
