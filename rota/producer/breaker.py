"""A circuit breaker: while Redis is down, stop paying its timeouts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import Enum


class BreakerState(Enum):
    CLOSED = "closed"  # calls go through
    OPEN = "open"  # calls are refused until the reset time has passed
    HALF_OPEN = "half-open"  # one probe call decides


class CircuitBreaker:
    def __init__(
        self,
        failures_to_open: int,
        reset_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures_to_open = failures_to_open
        self.reset_seconds = reset_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0

    @property
    def state(self) -> BreakerState:
        return self._state

    def allow(self) -> bool:
        """Whether to try the protected call now. After the reset time, one
        caller gets through as a probe while the others keep being refused."""
        with self._lock:
            if self._state is BreakerState.CLOSED:
                return True
            if self._state is BreakerState.OPEN and (
                self._clock() - self._opened_at >= self.reset_seconds
            ):
                self._state = BreakerState.HALF_OPEN
                return True
            return False

    def succeeded(self) -> None:
        with self._lock:
            self._state = BreakerState.CLOSED
            self._failures = 0

    def failed(self) -> None:
        with self._lock:
            self._failures += 1
            if self._state is BreakerState.HALF_OPEN or self._failures >= self.failures_to_open:
                self._state = BreakerState.OPEN
                self._opened_at = self._clock()
