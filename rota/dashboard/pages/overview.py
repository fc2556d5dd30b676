"""The overview (/): queues, top tenants, workers, the buffer and its dead
letters, from the one gatherer (rota.readmodel.figures); and the queues'
charts over ?window= (rota.dashboard.history)."""

from __future__ import annotations

from typing import Any

import psycopg
from starlette.requests import Request

from rota.dashboard import data, history


def overview(request: Request, c: data.Connections) -> dict[str, Any]:
    window = history.window_of(request.query_params.get("window"))
    found = data.overview(c)
    if "postgresql" not in found.get("unavailable", {}):
        try:
            found["charts"] = history.queue_charts(c, window)
        except psycopg.Error as exc:  # the figures still show
            found["unavailable"] = {**found["unavailable"], "charts": type(exc).__name__}
        found["window"] = window
        found["windows"] = list(history.WINDOWS)
    return found
