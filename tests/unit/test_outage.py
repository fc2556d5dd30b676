"""The one reconnect policy: backoff with jitter, one log line per outage edge."""

from __future__ import annotations

import asyncio
import logging
import random
import time

import pytest
import redis

from rota.buffer.redis_client import SERVER_LOST, WRITE_REFUSED, PolicyBackoff
from rota.core import db
from rota.runtime.outage import (
    CAP_SECONDS,
    LOOPS,
    Backoff,
    Kept,
    Outage,
    Polled,
    outages,
    run_rounds,
    run_until_done,
    with_async_retries,
    with_retries,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def most_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    """tenacity's random waits, at the top of their range."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high)


def test_backoff_doubles_with_jitter_up_to_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    backoff = Backoff(base=0.1, cap=2.0)
    most_jitter(monkeypatch)
    outage = Outage("db", logging.getLogger("t"), backoff=backoff)
    delays = [outage.failed(OSError("down")) for _ in range(8)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    low = Outage("db", logging.getLogger("t"), backoff=backoff)
    assert low.failed(OSError()) == pytest.approx(0.05)  # half fixed, half random


def test_the_policys_waits_are_bounded_and_jittered() -> None:
    # The n-th wait lies within [d/2, d], d = min(cap, base * 2**(n-1)); at
    # the cap, within [cap/2, cap], and never twice the same.
    for failures in (1, 2, 3, 5, 8, 40, 10_000):
        bound = min(CAP_SECONDS, 0.1 * 2.0 ** min(failures - 1, 60))
        waits = [LOOPS.delay(failures) for _ in range(200)]
        assert all(bound / 2 <= w <= bound for w in waits)
        assert len(set(waits)) > 150
    # redis-py's own retries wait the same.
    assert all(CAP_SECONDS / 2 <= PolicyBackoff().compute(30) <= CAP_SECONDS for _ in range(50))
    assert all(0.05 <= PolicyBackoff().compute(1) <= 0.1 for _ in range(50))


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


def test_run_until_done_gives_up_when_asked_or_past_its_deadline() -> None:
    calls = []

    def attempt() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("not yet")
        return "connected"

    outage = Outage("x", logging.getLogger("t"), backoff=Backoff(0.002, 0.004))
    assert run_until_done(attempt, outage, (ConnectionError,), lambda s: False) == "connected"
    assert len(calls) == 3 and not outage.down
    stopped = run_until_done(lambda: 1 / 0, outage, (ZeroDivisionError,), lambda s: True)
    assert stopped is None  # a stop was asked for while waiting
    past = run_until_done(
        lambda: 1 / 0, outage, (ZeroDivisionError,), lambda s: False, deadline=0.0
    )
    assert past is None


class FakeStop:
    """A Stop that records waits and sets itself after `run_rounds` waits."""

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


def test_a_kept_connection_closed_meanwhile_is_made_anew() -> None:
    kept: Kept[Conn] = Kept(Conn)
    first = kept.get()
    assert kept.get() is first
    first.close()  # by the server's going, say, with no error seen by the loop
    second = kept.get()
    assert second is not first and not second.closed and kept.get() is second


def test_run_rounds_reconnect_after_a_lost_server_and_carry_on_after_a_crash(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
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

    most_jitter(monkeypatch)
    outage = Outage("db", logging.getLogger("t"), backoff=Backoff(base=0.1, cap=2.0))
    stop = FakeStop(waits=6)
    with caplog.at_level(logging.WARNING):
        run_rounds(
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


def test_run_rounds_without_carry_on_let_a_crash_through() -> None:
    def work() -> float:
        raise ValueError("a bug")

    outage = Outage("y", logging.getLogger("t"))
    with pytest.raises(ValueError):
        run_rounds(work, outage, (ConnectionError,), FakeStop(waits=3))


def test_polled_stop_waits_until_its_check_says_stop() -> None:
    checks = iter([False, False, True])
    stop = Polled(lambda: next(checks), every=0.001)
    assert stop.wait(10) is True
    assert Polled(lambda: False, every=0.001).wait(0.005) is False


def test_every_loop_that_builds_an_outage_runs_through_the_policy() -> None:
    """A module that tracks an outage also reconnects through run_rounds or
    run_until_done (the producer's breaker only logs: enqueues fall back at once)."""
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
        if "Outage" in names and not exempt and not names & {"run_rounds", "run_until_done"}:
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


class Flaky:
    """Fails with `error` on its first `failures` calls, then answers."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self, arg: str) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return arg.upper()

    async def acall(self, arg: str) -> str:
        return self(arg)


QUICK = Backoff(base=0.002, cap=0.004)


def test_with_retries_calls_once_when_the_call_succeeds() -> None:
    flaky = Flaky(0, redis.ConnectionError("reset"))
    asked = []
    call = with_retries(flaky, SERVER_LOST, lambda arg: asked.append(arg) or 2, QUICK)
    assert call("x") == "X"
    assert flaky.calls == 1 and asked == []  # retries not even asked for
    acall = with_async_retries(flaky.acall, SERVER_LOST, lambda arg: asked.append(arg) or 2, QUICK)
    assert asyncio.run(acall("y")) == "Y"
    assert flaky.calls == 2 and asked == []


@pytest.mark.parametrize("failures, answered", [(1, True), (3, True), (4, False)])
def test_with_retries_tries_again_on_a_lost_server_then_raises(
    failures: int, answered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three retries: the first at once, the others after the policy's waits.
    errors = (*SERVER_LOST, *WRITE_REFUSED)
    for error in (redis.ConnectionError("reset"), redis.exceptions.ReadOnlyError("replica")):
        flaky = Flaky(failures, error)
        slept: list[float] = []
        monkeypatch.setattr(time, "sleep", slept.append)
        call = with_retries(flaky, errors, lambda arg: 3, QUICK)
        if answered:
            assert call("x") == "X"
        else:
            with pytest.raises(type(error)):
                call("x")
        monkeypatch.undo()
        assert flaky.calls == min(failures + 1, 4)
        assert len(slept) == min(failures, 3) - 1
        assert all(0.001 <= s <= 0.004 for s in slept)

        aflaky = Flaky(failures, error)
        acall = with_async_retries(aflaky.acall, errors, lambda arg: 3, QUICK)
        if answered:
            assert asyncio.run(acall("y")) == "Y"
        else:
            with pytest.raises(type(error)):
                asyncio.run(acall("y"))
        assert aflaky.calls == min(failures + 1, 4)


def test_with_retries_lets_other_errors_through_and_retries_only_when_asked() -> None:
    other = Flaky(1, redis.ResponseError("WRONGTYPE"))
    with pytest.raises(redis.ResponseError):
        with_retries(other, SERVER_LOST, lambda arg: 3, QUICK)("x")
    assert other.calls == 1
    none_asked = Flaky(1, redis.TimeoutError("slow"))
    with pytest.raises(redis.TimeoutError):
        with_retries(none_asked, SERVER_LOST, lambda arg: 0, QUICK)("x")  # e.g. a probe
    assert none_asked.calls == 1
    aother = Flaky(1, ValueError("a bug"))
    with pytest.raises(ValueError):
        asyncio.run(with_async_retries(aother.acall, SERVER_LOST, lambda arg: 3, QUICK)("x"))
    assert aother.calls == 1


def test_each_server_has_one_set_of_lost_errors() -> None:
    import psycopg

    assert issubclass(psycopg.errors.AdminShutdown, db.SERVER_LOST)  # an OperationalError
    assert not issubclass(psycopg.errors.UniqueViolation, db.SERVER_LOST)
    for lost in (
        redis.ConnectionError(),
        redis.TimeoutError(),
        redis.exceptions.BusyLoadingError(),
        redis.exceptions.ClusterDownError("CLUSTERDOWN"),
        redis.exceptions.TryAgainError(),
        redis.exceptions.SlotNotCoveredError(),
        ConnectionResetError(),
    ):
        assert isinstance(lost, SERVER_LOST)
    assert not isinstance(redis.ResponseError("WRONGTYPE"), SERVER_LOST + WRITE_REFUSED)


def test_tenacity_is_the_policys_alone() -> None:
    """One module of rota imports tenacity: the policy; the others retry through it."""
    import ast
    from pathlib import Path

    import rota

    root = Path(rota.__file__).parent
    importers = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(name.split(".")[0] == "tenacity" for name in names):
                importers.append(str(path.relative_to(root)))
    assert sorted(set(importers)) == ["runtime/outage.py"]
