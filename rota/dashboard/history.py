"""The charts' data: figures over a bounded window (15 minutes to a day, at
most MAX_POINTS buckets), read from the history maintenance keeps (per
queue, rota.queue_history; per tenant, rota.service by its tenant index),
never from the task tables, and kept for a moment like the pages' figures.
Each chart is the JSON-ready form rota.dashboard.charts draws; a bounded
number of series, the rest summed into "other"."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from rota.core import db, history, read
from rota.dashboard.data import Connections
from rota.errors import ValidationError
from rota.model.rules import check_tenant

WINDOWS = {"15m": 900, "1h": 3600, "6h": 21_600, "1d": 86_400}
DEFAULT_WINDOW = "1h"
MAX_POINTS = 120
TOP_QUEUES = 8
TOP_TENANTS = 6
MAX_SEARCHED = 5

Values = list[float | None]


def window_of(value: str | None) -> str:
    window = value or DEFAULT_WINDOW
    if window not in WINDOWS:
        raise ValidationError(f"window must be one of {', '.join(WINDOWS)}, got {window[:20]!r}")
    return window


def searched(values: Iterable[str]) -> list[str]:
    """Tenant names asked for (repeated, or comma-separated), checked."""
    names: list[str] = []
    for value in values:
        for name in (part.strip() for part in value.split(",")):
            if name and name not in names:
                check_tenant(name)
                names.append(name)
    if len(names) > MAX_SEARCHED:
        raise ValidationError(f"chart at most {MAX_SEARCHED} tenants at once")
    return names


class Axis:
    """A window's buckets: `step` seconds each (whole minutes), the last one
    the bucket now is in (partial: rates leave it out)."""

    def __init__(self, window: str, now: datetime | None = None) -> None:
        seconds = WINDOWS[window]
        self.window = window
        self.step = max(60, math.ceil(seconds / MAX_POINTS / 60) * 60)
        now = now or datetime.now(UTC)
        last = math.floor(now.timestamp() / self.step) * self.step
        self.count = seconds // self.step
        first = last - (self.count - 1) * self.step
        self.since = datetime.fromtimestamp(first, UTC)
        self.times = [self.since + timedelta(seconds=self.step * i) for i in range(self.count)]
        self.index = {t: i for i, t in enumerate(self.times)}

    def empty(self) -> Values:
        return [None] * self.count

    def chart(
        self, key: str, title: str, unit: str, series: list[dict[str, Any]]
    ) -> dict[str, Any]:
        for one in series:
            one["values"] = [clean(v) for v in one["values"]]
            if "now" in one:
                one["now"] = clean(one["now"])
        return {
            "id": key,
            "title": title,
            "unit": unit,
            "window": self.window,
            "step_seconds": self.step,
            "times": [t.isoformat() for t in self.times],
            "series": series,
        }


# Float residue: a figure this close to 0 is 0 (a difference of sums, such
# as "other", the total less the series shown, leaves ~1e-14).
RESIDUE = 1e-9


def clean(value: float | None) -> float | None:
    """A figure as charted: residue within RESIDUE of 0 is 0, the rest
    rounded to 6 decimals (beyond what any legend or tick shows)."""
    if value is None:
        return None
    return 0.0 if abs(value) < RESIDUE else round(value, 6)


def _add(into: Values, i: int, value: float | None) -> None:
    if value is not None:
        into[i] = (into[i] or 0.0) + value


def _top(
    by_name: dict[str, Values], n: int, other: Callable[[list[float]], float]
) -> list[dict[str, Any]]:
    """The `n` series with the largest peaks, and the rest as "other"."""
    ranked = sorted(by_name, key=lambda k: (-max((v or 0.0) for v in by_name[k]), k))
    series = [{"name": name, "values": by_name[name]} for name in ranked[:n]]
    rest = [by_name[name] for name in ranked[n:]]
    if rest:
        merged: Values = []
        for column in zip(*rest, strict=True):
            found = [v for v in column if v is not None]
            merged.append(other(found) if found else None)
        series.append({"name": "other", "values": merged})
    return series


def queue_charts(c: Connections, window: str) -> dict[str, dict[str, Any]]:
    """Throughput and deaths, backlog and oldest wait per queue."""

    def fetch() -> dict[str, dict[str, Any]]:
        axis = Axis(window)
        with c.postgres() as conn:
            points = db.run(conn, history.queue_history(axis.since, axis.step))
        return _queue_charts(axis, points)

    found: dict[str, dict[str, Any]] = c.recent.get(("queue-charts", window), fetch)
    return found


def _queue_charts(axis: Axis, points: Sequence[history.QueuePoint]) -> dict[str, dict[str, Any]]:
    completed, died = axis.empty(), axis.empty()
    waiting: dict[str, Values] = {}
    oldest: dict[str, Values] = {}
    # Each queue's gauges at the last count: what the legend says now.
    waiting_now: dict[str, float | None] = {}
    oldest_now: dict[str, float | None] = {}
    per_minute = 60 / axis.step
    for p in points:
        i = axis.index.get(p.at)
        if i is None:
            continue
        if i < axis.count - 1:  # a whole bucket
            _add(completed, i, p.completed * per_minute)
            _add(died, i, p.died * per_minute)
        waiting.setdefault(p.queue, axis.empty())[i] = p.waiting
        oldest.setdefault(p.queue, axis.empty())[i] = p.oldest_wait_seconds
        if i == axis.count - 1:
            waiting_now[p.queue] = p.waiting_last
            oldest_now[p.queue] = p.oldest_wait_last
    throughput = [{"name": "completed", "values": completed}, {"name": "died", "values": died}]
    backlog = _top(waiting, TOP_QUEUES, sum)
    oldest_series = _top(oldest, TOP_QUEUES, max)
    _set_now(backlog, waiting_now, sum)
    _set_now(oldest_series, oldest_now, max)
    minutes = f"{axis.step // 60}-minute" if axis.step > 60 else "minute"
    return {
        "throughput": axis.chart(
            "throughput", "Throughput and failures", "tasks per minute", throughput
        ),
        "backlog": axis.chart(
            "backlog",
            f"Backlog per queue (largest count in each {minutes})",
            "tasks waiting",
            backlog,
        ),
        "oldest_wait": axis.chart(
            "oldest_wait",
            f"Oldest wait per queue (largest in each {minutes})",
            "seconds",
            oldest_series,
        ),
    }


def _set_now(
    series: list[dict[str, Any]],
    now: dict[str, float | None],
    other: Callable[[list[float]], float],
) -> None:
    """Each series' figure at the last count (None: nothing), which the
    legend shows rather than the last value drawn; "other" merges the rest."""
    shown = {s["name"] for s in series if s["name"] != "other"}
    for one in series:
        if one["name"] == "other":
            rest = [v for k, v in now.items() if k not in shown and v is not None]
            one["now"] = other(rest) if rest else None
        else:
            one["now"] = now.get(one["name"])


def service_chart(c: Connections, window: str, names: Sequence[str]) -> dict[str, Any]:
    """Completions per minute of the tenants searched, the top tenants by
    completions in the window (its last hour at most, which the tenant index
    reads quickly) and by tasks waiting now, and everyone else's as "other"."""

    def fetch() -> dict[str, Any]:
        axis = Axis(window)
        ranked_since = max(axis.since, axis.times[-1] - timedelta(seconds=3600 - axis.step))
        with c.postgres() as conn:
            served = db.run(conn, history.top_served(ranked_since, TOP_TENANTS))
            top, _ = db.run(conn, read.top_tenants(TOP_TENANTS))
            waiting = [t.name for t in top if t.waiting > 0]
            shown = list(dict.fromkeys([*names, *served, *waiting]))
            totals = db.run(conn, history.queue_history(axis.since, axis.step))
            points = (
                db.run(conn, history.tenant_history(shown, axis.since, axis.step)) if shown else []
            )
        total = _queue_charts(axis, totals)["throughput"]["series"][0]["values"]
        by_tenant = _tenant_rates(axis, points, total)
        series: list[dict[str, Any]] = [
            {"name": name, "values": by_tenant.get(name) or _zeros(total)} for name in shown
        ]
        series.append({"name": "other", "values": rest_of(total, series)})
        chart = axis.chart("service", "Service per tenant", "completed per minute", series)
        chart["searched"] = list(names)
        return chart

    found: dict[str, Any] = c.recent.get(("service-chart", window, tuple(names)), fetch)
    return found


def rest_of(total: Values, series: Sequence[dict[str, Any]]) -> Values:
    """Everyone else's: the total less the series shown, bucket by bucket,
    never below 0 and without float residue."""
    rest: Values = []
    for i, whole in enumerate(total):
        shown_sum = sum((s["values"][i] or 0.0) for s in series)
        rest.append(None if whole is None else clean(max(0.0, whole - shown_sum)))
    return rest


def _zeros(total: Values) -> Values:
    return [None if v is None else 0.0 for v in total]


def _tenant_rates(
    axis: Axis, points: Sequence[history.TenantPoint], total: Values
) -> dict[str, Values]:
    """Each tenant's completions per minute: 0 where maintenance counted
    and it had none, a gap where nothing was counted."""
    rates: dict[str, Values] = {}
    per_minute = 60 / axis.step
    for p in points:
        i = axis.index.get(p.at)
        if i is not None and i < axis.count - 1:
            rates.setdefault(p.tenant, _zeros(total))[i] = p.completed * per_minute
    return rates


def tenant_charts(c: Connections, name: str, window: str) -> dict[str, dict[str, Any]]:
    """One tenant's completions against its demand and its max-min fair
    share (water-filling each minute's completions over the tenants' weights
    and demands: owed what it asked for when that is less than its weight's
    part), and the mean wait of what it got served."""

    def fetch() -> dict[str, dict[str, Any]]:
        axis = Axis(window)
        with c.postgres() as conn:
            totals = db.run(conn, history.queue_history(axis.since, axis.step))
            points = db.run(conn, history.tenant_history([name], axis.since, axis.step))
        total = _queue_charts(axis, totals)["throughput"]["series"][0]["values"]
        completed = _tenant_rates(axis, points, total).get(name) or _zeros(total)
        demand, fair = _zeros(total), axis.empty()
        per_minute = 60 / axis.step
        waits = axis.empty()
        for p in points:
            i = axis.index.get(p.at)
            if i is None:
                continue
            waits[i] = p.wait_seconds
            if i < axis.count - 1:
                # The bucket's demand: completions and what was unfinished
                # at its end, per minute of the bucket.
                demand[i] = p.demand * per_minute
                if p.fair_share is not None:
                    owed = p.fair_share * per_minute
                    done = completed[i] or 0.0
                    # Within rounding of what it was served: at its fair share
                    # (rota.core.history.FairShare's rule).
                    fair[i] = done if history.within_rounding(done, owed) else owed
        for i, whole in enumerate(total):  # counted, and it asked for nothing: owed nothing
            if whole is not None and i < axis.count - 1 and not demand[i]:
                fair[i] = 0.0
        service: list[dict[str, Any]] = [
            {"name": "completed", "values": completed},
            {"name": "demand", "values": demand, "dashed": True},
            {"name": "fair share", "values": fair, "dashed": True},
        ]
        return {
            "service": axis.chart("service", "Service", "tasks per minute", service),
            "wait": axis.chart(
                "wait",
                "Mean wait of tasks served (enqueue to start)",
                "seconds",
                [{"name": "mean wait", "values": waits}],
            ),
        }

    found: dict[str, dict[str, Any]] = c.recent.get(("tenant-charts", name, window), fetch)
    return found
