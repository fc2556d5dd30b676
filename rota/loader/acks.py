"""A long-running loader's acknowledgements, off its loading loop.

The loader's commits make tasks claimable without waiting for the WAL flush
(rota.core.commit_without_flush). Before the buffer forgets an entry, what
was loaded from it must be durable: here one thread waits for the flush (on
a connection of its own: a flush covers the WAL of every connection up to it)
and then acknowledges everything loaded before the flush began. A disk's
slow fsync then delays acknowledgements, never the next load, nor a task's
start. An entry never acknowledged (the loader died, PostgreSQL was lost)
stays in the buffer, is reclaimed and loaded again, as a duplicate if its
load survived.

A flush covers only commits made on the server it runs on, before it and
since that server last started: a load is settled only by a flush on a
connection opened before the load began and never lost since (a server
that restarted or failed over in between ended that connection).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import redis

from rota import core
from rota.core import connections, db, versions
from rota.loader.reading import Entry
from rota.runtime.outage import Kept, Outage, run_until_done
from rota.settings import Settings

log = logging.getLogger("rota.loader")

# Settling what was loaded at shutdown waits for PostgreSQL this long at most;
# what is left then is reclaimed and loaded again by a loader.
STOP_SECONDS = 10.0


class Acknowledger:
    """Runs each submitted settlement (dead letters, then acknowledgements)
    once a WAL flush that began after it was submitted has returned."""

    def __init__(self, settings: Settings) -> None:
        self._conn = Kept(self._connect)
        self._settings = settings
        self._connected_at = 0.0  # time.monotonic() when the connection was opened
        self._outage = Outage("PostgreSQL (the loader's flushes)", log)
        # (when the load began, time.monotonic(); its settlement; its entries)
        self._waiting: list[tuple[float, Callable[[], None], list[Entry]]] = []
        # Entries whose loads no flush could vouch for: the loop loads them again.
        self._again: list[Entry] = []
        self._busy = False
        self._stopping = False
        self._deadline: float | None = None
        self._changed = threading.Condition()
        self._open()
        self._thread = threading.Thread(target=self._run, name="rota-loader-acks", daemon=True)
        self._thread.start()

    def _open(self) -> None:
        """A connection open before the loads it is to cover begin: a load
        that began before it is left to be reclaimed and loaded again."""
        if self._conn.current is None:
            with contextlib.suppress(*db.SERVER_LOST):
                self._conn.get()

    def submit(self, began: float, settle: Callable[[], None], entries: list[Entry]) -> None:
        """`settle` once a flush covers the loads of `entries` that began at
        `began`; if PostgreSQL was lost since, the entries are handed back
        (`take_again`) instead."""
        with self._changed:
            self._waiting.append((began, settle, entries))
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
            self._open()
            with self._changed:
                while not self._waiting and not self._stopping:
                    self._changed.wait()
                if not self._waiting:
                    return
                batch, self._waiting = self._waiting, []
                self._busy = True
            try:
                self._settle(batch)
            except Exception:
                # Anything else: this batch is loaded again, the thread goes on.
                log.exception("settling loaded buffer entries failed; they are loaded again")
                self._conn.drop()
                with self._changed:
                    self._again.extend(entry for _, _, entries in batch for entry in entries)
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()

    def take_again(self) -> list[Entry]:
        """Entries to load again: their loads may have been lost."""
        with self._changed:
            again, self._again = self._again, []
        return again

    def _settle(self, batch: list[tuple[float, Callable[[], None], list[Entry]]]) -> None:
        since = run_until_done(
            self._flush,
            self._outage,
            db.SERVER_LOST,
            self._wait,
            lost=lambda _: self._conn.drop(),
        )
        if since is None:
            log.warning("%d load(s) left unacknowledged at shutdown: reclaimed later", len(batch))
            return
        lost = [entry for began, _, entries in batch if began < since for entry in entries]
        if lost:
            log.warning(
                "%d buffer entries not acknowledged: PostgreSQL was lost since their load"
                " began (loaded again)",
                len(lost),
            )
            with self._changed:
                self._again.extend(lost)
        for settle in [settle for began, settle, _ in batch if began >= since]:
            try:
                settle()
            except redis.RedisError as exc:
                # Left pending in the buffer: reclaimed and loaded again.
                log.warning("could not settle loaded buffer entries: %s", exc)

    def _connect(self) -> psycopg.Connection[Any]:
        conn = versions.ready(connections.connect(self._settings, "load"))
        self._connected_at = time.monotonic()  # after: the server side began before
        return conn

    def _flush(self) -> float:
        """Flushes; returns since when its connection has been open."""
        conn = self._conn.get()
        since = self._connected_at
        db.run(conn, core.flush_commits())
        return since

    def _wait(self, seconds: float) -> bool:
        """Waits out a backoff; True to give up (stopping, past the deadline)."""
        with self._changed:
            self._changed.wait(seconds)
            return self._stopping and time.monotonic() >= (self._deadline or 0.0)
