"""The JSON API's own endpoint, POST /api/tasks: enqueueing from any
language (the reads and actions are the pages' twins, rota.dashboard.web)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rota.dashboard import data
from rota.dashboard.web import Console


async def enqueue(request: Request, console: Console) -> Response:
    try:
        body = await request.json()
    except (ValueError, RecursionError):  # not JSON, not UTF-8, too deep
        return JSONResponse({"error": "the body is not JSON"}, status_code=400)
    found = await run_in_threadpool(data.enqueue, console.conns, body)
    return JSONResponse(found, status_code=201)
