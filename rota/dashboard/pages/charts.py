"""Charts (/charts): throughput and failures, backlog and oldest wait per
queue, and service per tenant (the top tenants by tasks waiting, and any
searched with ?tenant=), over a window chosen with ?window= (15m, 1h, 6h,
1d). Its JSON twin, /api/charts, sends the series."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from rota.dashboard import data, history


def charts(request: Request, c: data.Connections) -> dict[str, Any]:
    window = history.window_of(request.query_params.get("window"))
    names = history.searched(request.query_params.getlist("tenant"))
    return {
        "window": window,
        "windows": list(history.WINDOWS),
        "searched": names,
        "charts": {
            **history.queue_charts(c, window),
            "service": history.service_chart(c, window, names),
        },
    }
