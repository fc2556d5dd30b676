"""Tasks (/tasks, /tasks/ID): lists by state, tenant and queue, and a task's
story (why it waits); cancelling and retrying one or many; finding one by id."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote
from uuid import UUID

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from rota.dashboard import data
from rota.dashboard.web import PER_PAGE, Console, text, whole
from rota.errors import RotaError


def tasks(request: Request, c: data.Connections) -> dict[str, Any]:
    state = request.query_params.get("state", "ready")
    per_page = min(max(1, whole(request, "limit", PER_PAGE)), 1000)
    page = whole(request, "page", 1)
    return data.tasks(c, state, text(request, "tenant"), text(request, "queue"), page, per_page)


def story(request: Request, c: data.Connections) -> dict[str, Any]:
    return data.story(c, data.task_id(request.path_params["id"]))


def result(request: Request, c: data.Connections) -> dict[str, Any] | None:
    return data.result(c, data.task_id(request.path_params["id"]))


def cancel(
    request: Request, body: dict[str, Any], c: data.Connections, actor: str
) -> dict[str, Any]:
    return data.cancel(c, ids_of(request, body), actor)


def retry(
    request: Request, body: dict[str, Any], c: data.Connections, actor: str
) -> dict[str, Any]:
    return data.retry(c, ids_of(request, body), actor)


def ids_of(request: Request, body: dict[str, Any]) -> list[UUID]:
    """The task in the path, or the body's list of ids."""
    if "id" in request.path_params:
        return [data.task_id(request.path_params["id"])]
    ids = body.get("ids") or []
    if not isinstance(ids, list) or not ids:
        raise RotaError("ids must be a non-empty list of task ids")
    return [data.task_id(str(i)) for i in ids]


async def find(request: Request, console: Console) -> Response:
    wanted = (request.query_params.get("id") or "").strip()
    return RedirectResponse(f"/tasks/{quote(wanted)}" if wanted else "/", status_code=303)
