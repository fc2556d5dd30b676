"""Tenants (/tenants, /tenants/NAME): the list, sorted and paged, and one
tenant's figures, charts (?window=) and dead tasks; pausing, resuming and changing its limits."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from rota.dashboard import data, history
from rota.dashboard.auth import CSRF_FIELD
from rota.dashboard.web import PER_PAGE, whole
from rota.errors import RotaError

WHOLE_NUMBERS = ("concurrency_limit", "capacity")


def tenants(request: Request, c: data.Connections) -> dict[str, Any]:
    sort = request.query_params.get("sort", "waiting")
    descending = request.query_params.get("order", "desc") != "asc"
    prefix = request.query_params.get("prefix", "")
    per_page = min(max(1, whole(request, "per_page", PER_PAGE)), 500)
    found = data.tenants(c, sort, descending, prefix, whole(request, "page", 1), per_page)
    return {**found, **data.key_limits(c)}


def tenant(request: Request, c: data.Connections) -> dict[str, Any] | None:
    window = history.window_of(request.query_params.get("window"))
    found = data.tenant(c, request.path_params["name"])
    if found is not None:
        found["charts"] = history.tenant_charts(c, request.path_params["name"], window)
        found["window"] = window
        found["windows"] = list(history.WINDOWS)
    return found


def pause(
    request: Request, body: dict[str, Any], c: data.Connections, actor: str
) -> dict[str, Any]:
    return data.pause(c, "tenant", request.path_params["name"], True, actor)


def resume(
    request: Request, body: dict[str, Any], c: data.Connections, actor: str
) -> dict[str, Any]:
    return data.pause(c, "tenant", request.path_params["name"], False, actor)


def patch(
    request: Request, body: dict[str, Any], c: data.Connections, actor: str
) -> dict[str, Any]:
    return data.patch_tenant(c, request.path_params["name"], changes(body), actor)


def changes(body: dict[str, Any]) -> dict[str, Any]:
    """The limits a body changes: a form's numbers come as text, "" clears."""
    found = {k: v for k, v in body.items() if k not in (CSRF_FIELD, "back")}
    for key, value in list(found.items()):
        if isinstance(value, str):
            try:
                number = None if value.strip() == "" else float(value)
                if key in WHOLE_NUMBERS and number is not None:
                    number = int(number)
            except (ValueError, OverflowError):
                raise RotaError(f"{key} must be a number, got {value[:40]!r}") from None
            found[key] = number
    return found
