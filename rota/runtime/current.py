"""The running task, as the worker (and rota.testing) sets it around each run
and `rota.context()` reads it: context variables, so a task's own asyncio
tasks and threads started with contextvars.copy_context see it too."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rota.core import ClaimedTask

# The task running in this context.
current_task: contextvars.ContextVar[ClaimedTask] = contextvars.ContextVar("rota_task")


class CancelFlag:
    """Raised (`asked`) when a running task's cancel is asked; one per run,
    so as cheap to make as an object can be."""

    __slots__ = ("asked",)

    def __init__(self) -> None:
        self.asked = False


# The running task's flag (rota task cancel, the console).
current_cancel: contextvars.ContextVar[CancelFlag] = contextvars.ContextVar("rota_cancel")
