"""For load balancers and Prometheus: /healthz (the process answers),
/readyz (PostgreSQL answers) and /metrics (the overview's gauges)."""

from __future__ import annotations

import psycopg
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from rota.core import db, read
from rota.dashboard import data
from rota.dashboard.web import Console


async def healthz(request: Request, console: Console) -> Response:
    return PlainTextResponse("ok\n")


def ready(c: data.Connections) -> bool:
    with c.postgres() as conn:
        db.run(conn, read.ping())
    return True


async def readyz(request: Request, console: Console) -> Response:
    try:
        await run_in_threadpool(ready, console.conns)
    except psycopg.Error:
        return PlainTextResponse("not ready: PostgreSQL unavailable\n", status_code=503)
    return PlainTextResponse("ready\n")


async def metrics(request: Request, console: Console) -> Response:
    body = await run_in_threadpool(generate_latest, console.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
