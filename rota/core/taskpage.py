"""A page of a state's tasks through the console's lists (/tasks and
/api/tasks), and how many the filter has: the ids listed as rota.core.read
lists them, counted up to a bound."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import Any

from rota.core.db import Op, UUIDArray, select, values
from rota.core.paging import check_page
from rota.core.read import TASK_ROWS, TaskRow, ids_statement, task_params
from rota.errors import ValidationError
from rota.sql import query

# Tasks of a filter counted one by one, and paged through, at most: a page
# reads at most this many ids (plus one) of the listing's index range,
# whatever the queue's depth.
TASKS_COUNTED = 10_000


@dataclass(frozen=True)
class TaskPage:
    rows: list[TaskRow]
    total: int  # of the filter, counted up to TASKS_COUNTED
    more: bool  # over TASKS_COUNTED: `total` is a lower bound


def task_page(
    state: str,
    *,
    tenant: str | None = None,
    queue: str | None = None,
    offset: int = 0,
    limit: int = 50,
) -> Op[TaskPage]:
    """A page of a state's tasks (in the order of rota.core.read.tasks) and how many the
    filter has, counted up to TASKS_COUNTED; pages reach that far."""
    check_page(offset, limit)
    if offset >= TASKS_COUNTED:
        raise ValidationError(
            f"pages reach the first {TASKS_COUNTED:,} tasks of a filter: narrow it "
            "(tenant, queue) to see further"
        )
    statement = ids_statement(state, tenant, queue)
    return _task_page(
        statement, task_params(state, tenant, queue, TASKS_COUNTED + 1), offset, limit
    )


def _task_page(statement: str, params: dict[str, Any], offset: int, limit: int) -> Op[TaskPage]:
    ids = yield from values(statement, params)
    shown = list(islice(ids, offset, offset + limit))  # the page of the ids, in their order
    rows: list[TaskRow] = []
    if shown:
        rows = yield from select(query("task_rows"), {"ids": UUIDArray(shown)}, TASK_ROWS)
    return TaskPage(rows, min(len(ids), TASKS_COUNTED), len(ids) > TASKS_COUNTED)
