"""Operators' actions."""

from __future__ import annotations

from typing import Any

from rota.db import Execute, Op
from rota.rules import check_tenant, check_tenant_settings
from rota.sql import query


def configure_tenant(
    name: str,
    *,
    weight: float = 1.0,
    concurrency_limit: int | None = None,
    rate_limit: float | None = None,
    rate_burst: float | None = None,
    capacity: int | None = None,
) -> Op[int]:
    """Creates or changes a tenant; returns its slot (id). The name and
    settings are checked when this is called, before any connection is used."""
    check_tenant(name)
    check_tenant_settings(
        weight=weight,
        concurrency_limit=concurrency_limit,
        rate_limit=rate_limit,
        rate_burst=rate_burst,
        capacity=capacity,
    )
    return _configure_tenant(
        {
            "name": name,
            "weight": weight,
            "concurrency_limit": concurrency_limit,
            "rate_limit": rate_limit,
            "rate_burst": rate_burst,
            "capacity": capacity,
        }
    )


def _configure_tenant(params: dict[str, Any]) -> Op[int]:
    rows = yield Execute(query("configure_tenant"), params)
    return int(rows[0][0])
