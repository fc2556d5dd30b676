"""A queue's actions (the overview lists the queues): pausing and resuming."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from rota.dashboard import data


def pause(
    request: Request, body: dict[str, Any], c: data.Connections, actor: str
) -> dict[str, Any]:
    return data.pause(c, "queue", request.path_params["name"], True, actor)


def resume(
    request: Request, body: dict[str, Any], c: data.Connections, actor: str
) -> dict[str, Any]:
    return data.pause(c, "queue", request.path_params["name"], False, actor)
