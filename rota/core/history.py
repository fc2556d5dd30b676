"""The read model's history: the queues' and tenants' figures over time, in
buckets, for the console's charts (rota.queue_history and rota.service, kept
a day by maintenance)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from rota.core.db import Op, select, values
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
    # Completions, and the tasks unfinished at the bucket's last count: a
    # backlog carried across the bucket's minutes counts once.
    demand: int
    # Its minutes' max-min fair shares summed, at most the demand (None: no
    # fair level kept in the bucket).
    fair_share: float | None


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


FAIR_MINUTES = 5
# Served and fair share per minute agree "within rounding" when they differ
# by at most half the console's last shown digit (0.05 a minute) or half a
# unit of their third significant digit (0.5 %), whichever is larger.
ROUNDING_PER_MINUTE = 0.05
ROUNDING_RELATIVE = 0.005
# A tenant's tasks unfinished at the window's end that its own pace (its
# completions in the window's last minute) finishes within this many
# seconds are in flight, cut by the window's edge: not held back.
IN_FLIGHT_SECONDS = 5.0


@dataclass(frozen=True)
class FairShare:
    """A tenant's service against its max-min fair share, per minute over
    the last `minutes` whole minutes (rota.service, and the fair levels
    maintenance keeps per queue and minute).

    - served: its completions in the window.
    - demand: those and its tasks still unfinished at the window's end (its
      backlog at the window's start and its arrivals; unfinished as
      maintenance last counted them in the window's last minute): a backlog
      carried from minute to minute is asked for once, not once a minute.
    - fair share: water-filling each minute's completions over the tenants'
      weights and demands (owed what it asked for when that is less than
      its weight's part), summed over the window, at most its demand.
    - standing: "at" its fair share when served is within rounding of it
      (`within_rounding`), or short of it by no more than its tasks in
      flight at the window's end (`IN_FLIGHT_SECONDS`); the fair share is
      then shown as served. "below" (held back) or "above" otherwise; None
      when no fair level was kept for those minutes.

    Why not exact equality: each minute owes the small tenants the tasks
    still unfinished at its end (in flight, or arrived a moment before it
    ended) and the next minute owes them again when they complete, so the
    tenant that takes the rest of the queue is owed a little less than it
    got (served 600.0, fair share 599.8); and a tenant served as fast as it
    sends has a task or two in flight whenever the window ends. Neither is
    a tenant taking more than its share or being held back.
    """

    minutes: int
    served_per_minute: float
    demand_per_minute: float
    fair_share_per_minute: float | None  # None: no fair level kept for those minutes
    standing: str | None

    @property
    def held_back(self) -> bool:
        """Served less than its fair share (beyond rounding)."""
        return self.standing == "below"

    def as_fields(self) -> dict[str, Any]:
        """Its figures as the read model's tenant rows and details name them."""
        return {
            "fair_minutes": self.minutes,
            "served_per_minute": self.served_per_minute,
            "demand_per_minute": self.demand_per_minute,
            "fair_share_per_minute": self.fair_share_per_minute,
            "fair_standing": self.standing,
        }


def within_rounding(served: float, fair: float) -> bool:
    """Whether two figures per minute agree as the console rounds them."""
    tolerance = max(ROUNDING_PER_MINUTE, ROUNDING_RELATIVE * max(abs(served), abs(fair)))
    return abs(served - fair) <= tolerance


def shown(value: float) -> float:
    """A figure as every surface gives it: float residue within 1e-9 of a
    whole number dropped, at most three decimals."""
    nearest = round(value)
    return float(nearest) if abs(value - nearest) < 1e-9 else round(value, 3)


def fair_share(
    minutes: int,
    served: int,
    demand: int,
    fair: float | None,
    unfinished: int = 0,
    last_completed: int = 0,
) -> FairShare:
    """The figures of a window of `minutes`: counts of tasks over the window
    (`fair`: None when no fair level was kept; `unfinished` at its end and
    `last_completed` in its last minute) as figures per minute, with the
    standing."""
    share = 0.0 if demand == 0 else fair  # owed nothing it did not ask for
    served_pm, demand_pm = shown(served / minutes), shown(demand / minutes)
    if share is None:
        return FairShare(minutes, served_pm, demand_pm, None, None)
    share_pm = shown(max(0.0, share) / minutes)
    short = share - served  # in tasks over the window
    in_flight = 0 < short <= unfinished <= last_completed * IN_FLIGHT_SECONDS / 60
    if within_rounding(served_pm, share_pm) or in_flight:
        return FairShare(minutes, served_pm, demand_pm, served_pm, "at")
    return FairShare(
        minutes, served_pm, demand_pm, share_pm, "below" if served_pm < share_pm else "above"
    )


def wording(
    served: float, fair: float | None, demand: float, standing: str | None, digits: int = 1
) -> str:
    """The one wording of the figures per minute, on the console's pages and
    in `rota tenant`: "served X of fair share Y, demand Z (at its fair share)"."""

    def n(v: float) -> str:
        return f"{v:,.{digits}f}"

    if fair is None or standing is None:
        return f"served {n(served)}, demand {n(demand)} (fair share not kept)"
    return (
        f"served {n(served)} of fair share {n(fair)}, demand {n(demand)}"
        f" ({standing} its fair share)"
    )


class _Fair(NamedTuple):
    tenant: str
    served: int
    demand: int
    unfinished: int
    last_completed: int
    fair_share: float | None
    known: bool


_FAIR = Rows(
    _Fair, served=int, demand=int, unfinished=int, last_completed=int, fair_share=optional_float
)


def fair_shares(names: Sequence[str], minutes: int = FAIR_MINUTES) -> Op[dict[str, FairShare]]:
    """Some tenants' service, demand and fair share over the last `minutes`
    whole minutes (the minute now is partial), in one statement: the one
    definition the tenant page, the tenants list, `rota tenant`, the HTTP
    API and the metrics read. Tenants that do not exist are left out."""
    if type(minutes) is not int or not 1 <= minutes <= 1440:
        raise ValidationError(f"minutes must be whole, from 1 to 1440, got {minutes!r}")
    for name in names:
        check_tenant(name)
    check_page(0, max(1, len(names)))
    return _fair_shares(list(dict.fromkeys(names)), minutes)


def _fair_shares(names: list[str], minutes: int) -> Op[dict[str, FairShare]]:
    if not names:
        return {}
    found = yield from select(query("fair_shares"), {"names": names, "minutes": minutes}, _FAIR)
    return {
        f.tenant: fair_share(
            minutes,
            f.served,
            f.demand,
            f.fair_share if f.known else None,
            f.unfinished,
            f.last_completed,
        )
        for f in found
    }


def _check_step(step: Any) -> None:
    if type(step) is not int or not 60 <= step <= 86_400:
        raise ValidationError(f"a step must be whole seconds from 60 to 86400, got {step!r}")
