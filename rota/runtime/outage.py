"""One reconnect policy, for every loop and every retry.

Waits between attempts back off exponentially with jitter (so a fleet does
not reconnect in lockstep), up to a bound: a `Backoff`, made of tenacity's
wait strategies. A loop that loses PostgreSQL or Redis says so in its log
twice: when the outage starts and when it ends, never once per try. Every
loop runs through `run_rounds` (work again and again) or `run_until_done`
(one thing until it succeeds), holding its connection in a `Kept`:

    conn = Kept(lambda: db.connect(url))
    run_rounds(lambda: beat(conn.get()), Outage("PostgreSQL (heartbeat)", log),
               db.SERVER_LOST, stop, lost=conn.drop)

A call that must not wait long (a producer's buffer write) is wrapped by
`with_retries` (`with_async_retries`) to be tried again a few times, through
tenacity; redis-py's own retries wait per a `Backoff` too
(rota.buffer.redis_client). Each server's errors that mean "lost" are
defined once, beside its connections: `db.SERVER_LOST`,
`redis_client.SERVER_LOST`. Outages are counted per loop for the metrics
(`outages()`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random_exponential,
)
from tenacity.wait import wait_base

from rota.runtime.hints import connection_fix

A = TypeVar("A")
T = TypeVar("T")
C = TypeVar("C", bound="Closable")
Errors = tuple[type[BaseException], ...]
AC = TypeVar("AC", bound="AsyncClosable")


class Closable(Protocol):
    def close(self) -> None: ...


class AsyncClosable(Protocol):
    async def close(self) -> None: ...


class Stop(Protocol):
    """What a loop stops on: a threading.Event, or a `Polled` check."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Backoff:
    """Exponential backoff with "equal jitter", bounded: after the n-th
    failure in a row, with d = min(cap, base * 2**(n-1)), the wait is d/2
    plus a random share of the other half, so within [d/2, d]. `wait` is the
    tenacity strategy (tenacity's fixed and random exponential waits, each
    over half the range); `delay(n)` asks it outside a tenacity loop."""

    def __init__(self, base: float, cap: float) -> None:
        self.base, self.cap = base, cap
        fixed = wait_exponential(multiplier=base / 2, max=cap / 2)
        self.wait: wait_base = fixed + wait_random_exponential(multiplier=base / 2, max=cap / 2)

    def delay(self, failures: int) -> float:
        """The wait after `failures` failed attempts in a row (from 1)."""
        state = RetryCallState(_ASKING, None, (), {})
        state.attempt_number = failures
        return self.wait(state)


# The Retrying that `delay`'s call state belongs to (a wait reads only its attempt number).
_ASKING = Retrying()

# Loops: the first retry comes after at most BASE seconds; waits double up to
# CAP, which bounds how long a loop may sleep on after its server is back.
BASE_SECONDS = 0.1
CAP_SECONDS = 2.0
LOOPS = Backoff(BASE_SECONDS, CAP_SECONDS)


class Outage:
    """The state of one loop's connection: up, or down since when."""

    def __init__(
        self,
        what: str,
        log: logging.Logger,
        *,
        backoff: Backoff = LOOPS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.log = log
        self.backoff = backoff
        self._clock = clock
        self.since: float | None = None  # when the outage started
        self.attempts = 0
        self.count = 0  # outages so far
        self.last_error: BaseException | None = None
        with _LOCK:
            _LOOPS.add(self)

    @property
    def down(self) -> bool:
        return self.since is not None

    def down_for(self) -> float:
        return 0.0 if self.since is None else self._clock() - self.since

    def failed(self, error: BaseException) -> float:
        """Records a failed attempt; returns how long to wait before the next."""
        self.last_error = error
        if self.since is None:
            self.since = self._clock()
            self.count += 1
            self.log.warning("%s unavailable, reconnecting: %s", self.what, one_line(error))
        self.attempts += 1
        return self.backoff.delay(self.attempts)

    def recovered(self) -> None:
        """Records a success; logs the end of an outage, if there was one."""
        if self.since is not None:
            self.log.warning(
                "%s reachable again after %.1f s (%d attempts)",
                self.what,
                self._clock() - self.since,
                self.attempts,
            )
        self.since = None
        self.attempts = 0


_LOCK = threading.Lock()
_LOOPS: weakref.WeakSet[Outage] = weakref.WeakSet()


def outages() -> dict[str, tuple[int, bool]]:
    """Per loop of this process (by what it reaches): outages so far, and
    whether one is on now."""
    with _LOCK:
        loops = list(_LOOPS)
    found: dict[str, tuple[int, bool]] = {}
    for loop in loops:
        count, down = found.get(loop.what, (0, False))
        found[loop.what] = (count + loop.count, down or loop.down)
    return found


class Kept(Generic[C]):
    """The connection a loop keeps: made when first needed, closed and
    forgotten when lost (the next `get` makes a new one), and made anew when
    it was closed meanwhile (a psycopg connection says so: `closed`)."""

    def __init__(self, connect: Callable[[], C]) -> None:
        self._connect = connect
        self.current: C | None = None

    def get(self) -> C:
        if self.current is None or getattr(self.current, "closed", False):
            self.current = self._connect()
        return self.current

    def drop(self, _error: BaseException | None = None) -> None:
        if self.current is not None:
            with contextlib.suppress(Exception):  # already broken: best effort
                self.current.close()
            self.current = None


class AsyncKept(Generic[AC]):
    """`Kept`, for asyncio connections."""

    def __init__(self, connect: Callable[[], Awaitable[AC]]) -> None:
        self._connect = connect
        self.current: AC | None = None

    async def get(self) -> AC:
        if self.current is None or getattr(self.current, "closed", False):
            self.current = await self._connect()
        return self.current

    async def drop(self, _error: BaseException | None = None) -> None:
        if self.current is not None:
            with contextlib.suppress(Exception):  # already broken: best effort
                await self.current.close()
            self.current = None


class Polled:
    """A `Stop` made of a check (`should_stop()`), polled while waiting."""

    def __init__(self, should_stop: Callable[[], bool], every: float = 0.05) -> None:
        self.should_stop, self.every = should_stop, every

    def is_set(self) -> bool:
        return self.should_stop()

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.should_stop():
            left = self.every if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self.every, left))
        return True


def run_rounds(
    work: Callable[[], float | None],
    outage: Outage,
    errors: Errors,
    stop: Stop,
    *,
    lost: Callable[[BaseException], None] | None = None,
    carry_on: str | None = None,
    pause_after_crash: float = 1.0,
) -> None:
    """Calls `work` round after round until `stop` is set; `work` returns how
    long to wait before the next round (None: no wait). One of `errors` is a
    lost server: `lost(error)` drops what the loop held, and the next round
    comes after the outage's backoff. With `carry_on` (what the loop does,
    for the log), any other exception is logged and the loop goes on after
    `pause_after_crash`; without, it propagates."""
    while not stop.is_set():
        try:
            pause = work()
        except errors as exc:
            if lost is not None:
                lost(exc)
            stop.wait(outage.failed(exc))
            continue
        except Exception:
            if carry_on is None:
                raise
            outage.log.exception("%s failed; carrying on", carry_on)
            pause = pause_after_crash
        else:
            outage.recovered()
        if pause:
            stop.wait(pause)


def run_until_done(
    attempt: Callable[[], T],
    outage: Outage,
    errors: Errors,
    wait: Callable[[float], bool],
    deadline: float | None = None,
    lost: Callable[[BaseException], None] | None = None,
) -> T | None:
    """Calls `attempt` until it succeeds, waiting per `outage` after each of
    `errors` (after `lost(error)`, if given). `wait(seconds)` returns True to
    give up (a stop was asked for); so does `deadline` (time.monotonic()),
    when the next attempt could not start before it. Returns None on giving
    up (`outage.last_error` says why)."""
    while True:
        try:
            result = attempt()
        except errors as exc:
            if lost is not None:
                lost(exc)
            delay = outage.failed(exc)
            if deadline is not None and time.monotonic() + delay >= deadline:
                return None  # the next attempt would start too late
            if wait(delay):
                return None
            continue
        outage.recovered()
        return result


def _retries(times: int, errors: Errors, backoff: Backoff) -> dict[str, Any]:
    """Tenacity's arguments for `times` retries after a first failure."""
    return {
        "stop": stop_after_attempt(times),
        "wait": backoff.wait,
        "retry": retry_if_exception_type(errors),
        "reraise": True,
    }


def with_retries(
    attempt: Callable[[A], T], errors: Errors, retries: Callable[[A], int], backoff: Backoff
) -> Callable[[A], T]:
    """`attempt`, tried again `retries(arg)` times after it failed with one of
    `errors` (the first retry at once, then waiting per `backoff`), the last
    error raised. The first attempt is a plain call: tenacity's machinery,
    which costs more than a fast call itself, runs only once it failed."""

    def call(arg: A) -> T:
        try:
            return attempt(arg)
        except errors:
            times = retries(arg)
            if not times:
                raise
        return Retrying(**_retries(times, errors, backoff))(attempt, arg)

    return call


def with_async_retries(
    attempt: Callable[[A], Awaitable[T]],
    errors: Errors,
    retries: Callable[[A], int],
    backoff: Backoff,
) -> Callable[[A], Awaitable[T]]:
    """`with_retries`, awaited."""

    async def call(arg: A) -> T:
        try:
            return await attempt(arg)
        except errors:
            times = retries(arg)
            if not times:
                raise
        return await AsyncRetrying(**_retries(times, errors, backoff))(attempt, arg)

    return call


def one_line(error: BaseException) -> str:
    """An error as a log line says it: its type, its first line, the known fix."""
    text = str(error).strip().splitlines()
    fix = connection_fix(error)
    return f"{type(error).__name__}: {text[0] if text else ''}" + (f"; {fix}" if fix else "")
