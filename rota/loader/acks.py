"""A long-running loader's acknowledgements, off its loading loop.

The loader's commits make tasks claimable without waiting for the WAL flush
(rota.core.commit_without_flush). Before the buffer forgets an entry, what
was loaded from it must be durable: here one thread waits for the flush (on
a connection of its own: a flush covers the WAL of every session up to it)
and then acknowledges everything loaded before the flush began. A disk's
slow fsync then delays acknowledgements, never the next load, nor a task's
start. An entry never acknowledged (the loader died, PostgreSQL was lost)
stays in the buffer, is reclaimed and loaded again, as a duplicate if its
load survived.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from rota import core
from rota.core import connections, db
from rota.runtime.outage import Kept, Outage, retrying
from rota.settings import Settings

log = logging.getLogger("rota.loader")

# Settling what was loaded at shutdown waits for PostgreSQL this long at most;
# what is left then is reclaimed and loaded again by a loader.
STOP_SECONDS = 10.0


class Acknowledger:
    """Runs each submitted settlement (dead letters, then acknowledgements)
    once a WAL flush that began after it was submitted has returned."""

    def __init__(self, settings: Settings) -> None:
        self._conn = Kept(lambda: connections.connect(settings, "load"))
        self._outage = Outage("PostgreSQL (the loader's flushes)", log)
        self._waiting: list[Callable[[], None]] = []
        self._busy = False
        self._stopping = False
        self._deadline: float | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="rota-loader-acks", daemon=True)
        self._thread.start()

    def submit(self, settle: Callable[[], None]) -> None:
        with self._changed:
            self._waiting.append(settle)
            self._changed.notify_all()

    def wait_settled(self, timeout: float) -> bool:
        """Whether everything submitted was settled within `timeout`."""
        end = time.monotonic() + timeout
        with self._changed:
            while self._waiting or self._busy:
                left = end - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._changed.wait(left)
        return True

    def stop(self) -> None:
        """Settles what is waiting (within STOP_SECONDS), then ends."""
        with self._changed:
            self._stopping = True
            self._deadline = time.monotonic() + STOP_SECONDS
            self._changed.notify_all()
        self._thread.join(STOP_SECONDS + 5)
        self._conn.drop()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._waiting and not self._stopping:
                    self._changed.wait()
                if not self._waiting:
                    return
                batch, self._waiting = self._waiting, []
                self._busy = True
            try:
                self._settle(batch)
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()

    def _settle(self, batch: list[Callable[[], None]]) -> None:
        flushed = retrying(
            self._flush,
            self._outage,
            db.SERVER_LOST,
            self._wait,
            lost=lambda _: self._conn.drop(),
        )
        if flushed is None:
            log.warning("%d load(s) left unacknowledged at shutdown: reclaimed later", len(batch))
            return
        for settle in batch:
            try:
                settle()
            except redis.RedisError as exc:
                # Left pending in the buffer: reclaimed and loaded again.
                log.warning("could not acknowledge loaded buffer entries: %s", exc)

    def _flush(self) -> bool:
        db.run(self._conn.get(), core.flush_commits())
        return True

    def _wait(self, seconds: float) -> bool:
        """Waits out a backoff; True to give up (stopping, past the deadline)."""
        with self._changed:
            self._changed.wait(seconds)
            return self._stopping and time.monotonic() >= (self._deadline or 0.0)
