"""One reconnect policy for every long-running loop.

A loop that loses PostgreSQL or Redis waits between attempts with exponential
backoff and jitter (so a fleet does not reconnect in lockstep), and says so in
its log twice: when the outage starts and when it ends, never once per try.

    outage = Outage("PostgreSQL (claims)", log)
    while running:
        try:
            work()
        except psycopg.OperationalError as exc:
            stop.wait(outage.failed(exc))
            continue
        outage.recovered()
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# The first retry comes after about BASE seconds; waits double up to CAP,
# which bounds how long a loop may sleep on after its server is back.
BASE_SECONDS = 0.1
CAP_SECONDS = 2.0


class Outage:
    """The state of one loop's connection: up, or down since when."""

    def __init__(
        self,
        what: str,
        log: logging.Logger,
        *,
        base: float = BASE_SECONDS,
        cap: float = CAP_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.what = what
        self.log = log
        self.base = base
        self.cap = cap
        self._clock = clock
        self._jitter = jitter
        self.since: float | None = None  # when the outage started
        self.attempts = 0

    @property
    def down(self) -> bool:
        return self.since is not None

    def down_for(self) -> float:
        return 0.0 if self.since is None else self._clock() - self.since

    def failed(self, error: BaseException) -> float:
        """Records a failed attempt; returns how long to wait before the next."""
        if self.since is None:
            self.since = self._clock()
            self.log.warning("%s unavailable, reconnecting: %s", self.what, _one_line(error))
        delay: float = min(self.cap, self.base * 2.0 ** min(self.attempts, 30))
        self.attempts += 1
        return delay * (0.5 + self._jitter() / 2)  # "equal jitter": half fixed, half random

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


def retrying(
    attempt: Callable[[], T],
    outage: Outage,
    errors: tuple[type[BaseException], ...],
    wait: Callable[[float], bool],
    deadline: float | None = None,
) -> T | None:
    """Calls `attempt` until it succeeds, waiting per `outage` after each of
    `errors`. `wait(seconds)` returns True to give up (a stop was asked for);
    so does passing `deadline` (time.monotonic()). Returns None on giving up."""
    while True:
        try:
            result = attempt()
        except errors as exc:
            delay = outage.failed(exc)
            if deadline is not None:
                delay = min(delay, deadline - time.monotonic())
                if delay <= 0:
                    return None
            if wait(delay):
                return None
            continue
        outage.recovered()
        return result


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
