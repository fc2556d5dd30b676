"""The overview (/): queues, top tenants, workers, the buffer and its dead
letters, from the one gatherer (rota.readmodel.figures)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from rota.console import data


def overview(request: Request, c: data.Connections) -> dict[str, Any]:
    return data.overview(c)
