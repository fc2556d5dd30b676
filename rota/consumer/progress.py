"""The worker's flush of its tasks' progress: from the heartbeat thread, at
most every FLUSH_SECONDS (and at its rounds, ROTA_MAINTENANCE_SECONDS), the
latest values of the tasks whose progress changed since the last flush, all
in one statement (rota.report_progress), fenced by their attempt tokens. A
task's last values are stored after it ended too (by the attempt that ended
it). A flush that fails is logged; its values go with the next one, and the
tasks and the heartbeat go on."""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg

from rota import core
from rota.core import db
from rota.core.progress import report_progress
from rota.model.progress import Values
from rota.runtime.progress import ProgressSlot

if TYPE_CHECKING:
    from rota.consumer.running import InFlight

log = logging.getLogger("rota.worker")

# A task's progress is stored at most this often (one statement for all).
FLUSH_SECONDS = 1.0
# A failing flush is logged at most this often.
LOG_EVERY_SECONDS = 60.0


class ProgressFlush:
    """The slots of the tasks that reported progress, until their last values
    are stored and their task ended."""

    def __init__(self, key: core.WorkerKey | None, in_flight: Mapping[UUID, InFlight]) -> None:
        self.key = key
        self.in_flight = in_flight  # the worker's tasks in flight
        # Slots append themselves on their first report (any thread).
        self.reported: collections.deque[ProgressSlot] = collections.deque()
        self._watched: dict[tuple[UUID, int], ProgressSlot] = {}
        self._logged_at = float("-inf")
        self._flushed_at = float("-inf")

    def slot(self, token: tuple[UUID, int]) -> ProgressSlot:
        """A new run's slot."""
        return ProgressSlot(token, self.reported)

    def changes(self) -> list[tuple[ProgressSlot, Values]]:
        """The slots whose latest values are not stored yet, with those values;
        forgets the slots whose task ended with its last values stored."""
        while self.reported:
            slot = self.reported.popleft()
            self._watched[slot.token] = slot
        changed = []
        for token, slot in list(self._watched.items()):
            values = slot.latest
            if values is not None and values is not slot.stored:
                changed.append((slot, values))
                continue
            flight = self.in_flight.get(token[0])
            # Every report of a run comes before its end, which comes before
            # the claim loop takes it out of `in_flight`.
            if flight is None or flight.task.attempt != token[1]:
                self._watched.pop(token, None)  # the shutdown's flush races this one
        return changed

    def flush(self, conn: psycopg.Connection[Any], now: bool = False) -> None:
        """Stores what changed since the last flush, in one statement, once
        FLUSH_SECONDS have passed since it (`now`: at once). Values refused
        (a lease lost) are not sent again; on an error they are."""
        if not now and time.monotonic() - self._flushed_at < FLUSH_SECONDS:
            return
        self._flushed_at = time.monotonic()
        changed = self.changes()
        if not changed:
            return
        reports = [(slot.token, values) for slot, values in changed]
        try:
            db.run(conn, report_progress(reports, self.key))
        except db.SERVER_LOST:
            raise  # the heartbeat thread reconnects; the values go with the next flush
        except Exception as exc:  # a flush never ends the heartbeat
            if time.monotonic() - self._logged_at >= LOG_EVERY_SECONDS:
                self._logged_at = time.monotonic()
                log.warning("could not store the progress of %d task(s): %s", len(changed), exc)
            return
        for slot, values in changed:
            slot.stored = values
