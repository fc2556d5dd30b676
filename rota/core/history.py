"""The read model's history: the queues' and tenants' figures over time, in
buckets, for the console's charts (rota.queue_history and rota.service, kept
a day by maintenance)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rota.core.db import Op, first, select
from rota.core.read import _check_page, _float
from rota.core.rows import Rows
from rota.errors import ValidationError
from rota.model.rules import check_tenant
from rota.sql import query


@dataclass(frozen=True)
class QueuePoint:
    at: datetime  # the bucket's start
    queue: str
    waiting: int  # the largest backlog counted in the bucket
    oldest_wait_seconds: float | None
    completed: int
    died: int


_QUEUE_POINTS = Rows(QueuePoint, waiting=int, oldest_wait_seconds=_float, completed=int, died=int)


def queue_history(since: datetime, step_seconds: int) -> Op[list[QueuePoint]]:
    """Each queue's backlog, oldest wait, completions and deaths since a time
    (a day is kept), in buckets of `step_seconds`."""
    _check_step(step_seconds)
    return select(query("queue_history"), {"since": since, "step": step_seconds}, _QUEUE_POINTS)


@dataclass(frozen=True)
class TenantPoint:
    at: datetime  # the bucket's start
    tenant: str
    completed: int
    wait_seconds: float | None  # mean enqueue -> start wait


_TENANT_POINTS = Rows(TenantPoint, completed=int, wait_seconds=_float)


def tenant_history(
    names: Sequence[str], since: datetime, step_seconds: int
) -> Op[list[TenantPoint]]:
    """Some tenants' completions and mean wait since a time, in buckets."""
    _check_step(step_seconds)
    for name in names:
        check_tenant(name)
    _check_page(0, max(1, len(names)))
    params = {"names": list(names), "since": since, "step": step_seconds}
    return select(query("tenant_history"), params, _TENANT_POINTS)


def tenant_fair_share(name: str) -> Op[float | None]:
    """A tenant's fair share now (None without work)."""
    check_tenant(name)
    return first(query("tenant_fair_share"), {"name": name}, Rows(_float, ["fair_share"]))


def _check_step(step: Any) -> None:
    if type(step) is not int or not 60 <= step <= 86_400:
        raise ValidationError(f"a step must be whole seconds from 60 to 86400, got {step!r}")
