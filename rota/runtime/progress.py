"""Where a running task's progress waits for its worker to store it.

`rota.context().progress()` checks its values and puts them in the run's
`ProgressSlot` (a context variable, as the running task is): no I/O, no lock,
one attribute written, so a task may call it in a tight loop. The worker
stores the latest values of each slot at most about once a second
(rota.consumer.progress). A child process of the process pool has a slot
that sends its latest values to the worker over its pipe instead
(rota.consumer.processes)."""

from __future__ import annotations

import contextvars
from collections import deque
from uuid import UUID

from rota.model.progress import Values


class ProgressSlot:
    """One run's latest progress (`latest`), and the values last stored
    (`stored`: the worker's flush compares them by identity). On its first
    report the slot puts itself in `reported`, which the flush takes from."""

    __slots__ = ("latest", "reported", "stored", "token")

    def __init__(self, token: tuple[UUID, int], reported: deque[ProgressSlot] | None) -> None:
        self.token = token
        self.latest: Values | None = None
        self.stored: Values | None = None
        self.reported = reported

    def report(self, values: Values) -> None:
        # One assignment: whoever reads `latest` sees old or new values whole.
        first = self.latest is None
        self.latest = values
        if first and self.reported is not None:
            self.reported.append(self)  # twice at worst, in a race: the flush dedups


# The running task's slot; none under rota.testing, where progress is checked
# and not kept.
current_progress: contextvars.ContextVar[ProgressSlot | None] = contextvars.ContextVar(
    "rota_progress"
)
