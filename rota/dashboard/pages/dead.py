"""The dead: dead letters (/dead-letters: buffer entries that could not be
loaded), replayed or purged; dead tasks retried by tenant or queue."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from rota.dashboard import data
from rota.dashboard.web import PER_PAGE, text
from rota.errors import RotaError


def dead_letters(request: Request, c: data.Connections) -> dict[str, Any]:
    return data.dead_letters(c, text(request, "before"), PER_PAGE)


def replay(
    request: Request, body: dict[str, Any], c: data.Connections, actor: str
) -> dict[str, Any]:
    return data.replay(c, letter_ids(body), actor)


def purge(
    request: Request, body: dict[str, Any], c: data.Connections, actor: str
) -> dict[str, Any]:
    everything = body.get("all") in (True, "true", "on")
    return data.purge(c, letter_ids(body), everything, actor)


def retry_tasks(
    request: Request, body: dict[str, Any], c: data.Connections, actor: str
) -> dict[str, Any]:
    return data.retry_dead(c, actor, body.get("tenant") or None, body.get("queue") or None)


def letter_ids(body: dict[str, Any]) -> list[str]:
    ids = body.get("ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise RotaError("ids must be a list of dead letter ids")
    return ids
