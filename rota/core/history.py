"""The read model's history: the queues' and tenants' figures over time, in
buckets, for the console's charts (rota.queue_history and rota.service, kept
a day by maintenance)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from rota.core.db import Op, first, select, values
from rota.core.paging import check_page
from rota.core.rows import Rows, optional_float
from rota.errors import ValidationError
from rota.model.rules import check_tenant
from rota.sql import query


@dataclass(frozen=True)
class QueuePoint:
    at: datetime  # the bucket's start
    queue: str
    waiting: int  # the largest backlog counted in the bucket
    waiting_last: int  # the backlog at the bucket's last count
    running: int  # the most tasks running at a count (rota.claims: not prefetched ones)
    oldest_wait_seconds: float | None  # the largest counted in the bucket
    oldest_wait_last: float | None  # at the bucket's last count (None: nothing waited)
    completed: int
    died: int


_QUEUE_POINTS = Rows(
    QueuePoint,
    waiting=int,
    waiting_last=int,
    running=int,
    oldest_wait_seconds=optional_float,
    oldest_wait_last=optional_float,
    completed=int,
    died=int,
)


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
    demand: int  # completions and unfinished tasks at each minute's last count
    fair_share: float | None  # max-min fair share of the completions (None: not kept)


_TENANT_POINTS = Rows(
    TenantPoint, completed=int, wait_seconds=optional_float, demand=int, fair_share=optional_float
)


def tenant_history(
    names: Sequence[str], since: datetime, step_seconds: int
) -> Op[list[TenantPoint]]:
    """Some tenants' completions and mean wait since a time, in buckets."""
    _check_step(step_seconds)
    for name in names:
        check_tenant(name)
    check_page(0, max(1, len(names)))
    params = {"names": list(names), "since": since, "step": step_seconds}
    return select(query("tenant_history"), params, _TENANT_POINTS)


def top_served(since: datetime, limit: int) -> Op[list[str]]:
    """The tenants most served since a time (with any completion), most first."""
    check_page(0, limit)
    return values(query("top_served"), {"since": since, "limit": limit})


@dataclass(frozen=True)
class FairShare:
    """A tenant's service against its max-min fair share, per minute over
    the last whole minutes: the fair share is what water-filling the
    completions over the tenants' weights and demands owes it."""

    minutes: int
    served_per_minute: float
    demand_per_minute: float  # completions and unfinished tasks
    fair_share_per_minute: float | None  # None: no fair level kept for those minutes

    @property
    def held_back(self) -> bool:
        """Served less than its fair share."""
        share = self.fair_share_per_minute
        return share is not None and self.served_per_minute < share - 1e-9


class _Fair(NamedTuple):
    served: int
    demand: int
    fair_share: float | None
    known: bool


FAIR_MINUTES = 5


def tenant_fair_share(tenant_id: int, minutes: int = FAIR_MINUTES) -> Op[FairShare]:
    """One tenant's service, demand and fair share over the last `minutes`
    whole minutes (rota.service and the queues' fair levels)."""
    if type(minutes) is not int or not 1 <= minutes <= 1440:
        raise ValidationError(f"minutes must be whole, from 1 to 1440, got {minutes!r}")
    return _tenant_fair_share(tenant_id, minutes)


def _tenant_fair_share(tenant_id: int, minutes: int) -> Op[FairShare]:
    found = yield from first(
        query("tenant_fair_share"),
        {"tenant_id": tenant_id, "minutes": minutes},
        Rows(_Fair, served=int, demand=int, fair_share=optional_float),
    )
    served, demand = (found.served, found.demand) if found else (0, 0)
    share: float | None = None
    if demand == 0:
        share = 0.0  # owed nothing it did not ask for
    elif found is not None and found.known and found.fair_share is not None:
        share = found.fair_share
    return FairShare(
        minutes=minutes,
        served_per_minute=served / minutes,
        demand_per_minute=demand / minutes,
        fair_share_per_minute=None if share is None else share / minutes,
    )


def _check_step(step: Any) -> None:
    if type(step) is not int or not 60 <= step <= 86_400:
        raise ValidationError(f"a step must be whole seconds from 60 to 86400, got {step!r}")
