"""Limits on keys (rota.Limit, docs/howto/limits.md): declared by an app's
workers, set, reset and dropped by operators, listed with their keys'
counters. The claim enforces them (rota.key_admit)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from rota.core.db import Op, select, value, values
from rota.core.rows import Rows
from rota.model.limits import Limit
from rota.model.rules import check_limit_name
from rota.sql import query


def declare_limits(limits: Iterable[Limit], actor: str) -> Op[list[str]]:
    """Sets the limits an app declares with numbers (each name once: the
    first declaration of a name wins), unless an operator set them; returns
    the names set (new or changed)."""
    declared: dict[str, Limit] = {}
    for limit in limits:
        if limit.declared:
            declared.setdefault(limit.name, limit)
    if not declared:
        return []
    chosen = sorted(declared.values(), key=lambda limit: limit.name)
    params = {
        "names": [limit.name for limit in chosen],
        "concurrency": [limit.concurrency for limit in chosen],
        "rates": [None if limit.rate is None else float(limit.rate) for limit in chosen],
        "bursts": [None if limit.burst is None else float(limit.burst) for limit in chosen],
        "actor": actor,
    }
    return [str(name) for name in (yield from values(query("declare_limits"), params))]


def set_limit(limit: Limit, actor: str) -> Op[int]:
    """An operator's setting of a limit (its numbers as given, those not
    given cleared), kept over the app's declarations until reset."""
    params = {
        "name": limit.name,
        "concurrency": limit.concurrency,
        "rate": None if limit.rate is None else float(limit.rate),
        "burst": None if limit.burst is None else float(limit.burst),
        "actor": actor,
    }
    return int((yield from value(query("set_limit"), params)))


def reset_limit(name: str) -> Op[bool]:
    """Hands a limit back to the app's declaration; False for an unknown name."""
    check_limit_name(name)
    return bool((yield from values(query("reset_limit"), {"name": name})))


def drop_limit(name: str, actor: str) -> Op[bool]:
    """Removes a limit (its keys' tasks run unlimited); False for an unknown name."""
    check_limit_name(name)
    return bool((yield from value(query("drop_limit"), {"name": name, "actor": actor})))


class LimitUsage(NamedTuple):
    name: str
    concurrency: int | None
    rate: float | None
    burst: float
    declared: bool
    keys: int
    running: int
    busiest_running: int  # the most running under one key
    parked: int  # tasks waiting for their key's room


_USAGE = Rows(LimitUsage)


def limits() -> Op[list[LimitUsage]]:
    """Every limit on keys, with its keys' counters."""
    return (yield from select(query("limits"), None, _USAGE))
