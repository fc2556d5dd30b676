"""The operations console: server-rendered pages and a JSON API over the
same data, for people and for scripts in any language. Each page's handlers
live in rota.dashboard.pages, the wrapping they share in rota.dashboard.web;
here they are routed.

    rota dashboard --host 127.0.0.1 --port 8377
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import Route

from rota.dashboard.headers import SecurityHeaders
from rota.dashboard.pages import (
    api,
    charts,
    dead,
    health,
    icon,
    overview,
    queue,
    session,
    task,
    tenant,
    workers,
)
from rota.dashboard.web import Console, Do, Fetch
from rota.settings import Settings

MAX_BODY = 4 * 1024 * 1024

# Each page at PATH, its data at /api PATH.
PAGES: list[tuple[str, Fetch, str]] = [
    ("/", overview.overview, "overview.html"),
    ("/charts", charts.charts, "charts.html"),
    ("/tenants", tenant.tenants, "tenants.html"),
    ("/tenants/{name}", tenant.tenant, "tenant.html"),
    ("/tasks", task.tasks, "tasks.html"),
    ("/tasks/{id}", task.story, "task.html"),
    ("/workers", workers.workers, "workers.html"),
    ("/dead-letters", dead.dead_letters, "dead_letters.html"),
]
# Each action a POST to /api PATH (JSON) and to /actions PATH (a form).
ACTIONS: list[tuple[str, Do]] = [
    ("/tasks/{id}/cancel", task.cancel),
    ("/tasks/{id}/retry", task.retry),
    ("/tasks/cancel", task.cancel),
    ("/tasks/retry", task.retry),
    ("/dead/retry", dead.retry_tasks),
    ("/queues/{name}/pause", queue.pause),
    ("/queues/{name}/resume", queue.resume),
    ("/tenants/{name}/pause", tenant.pause),
    ("/tenants/{name}/resume", tenant.resume),
    ("/tenants/{name}", tenant.patch),
    ("/dead-letters/replay", dead.replay),
    ("/dead-letters/purge", dead.purge),
]


def create_app(settings: Settings) -> Starlette:
    console = Console(settings)
    guarded, serve = console.guarded, console.serving
    routes: list[Route] = []
    for path, fetch, template in PAGES:
        data, html = console.reading(fetch, template)
        routes.append(Route(path, guarded(html, api=False)))
        routes.append(Route("/api" + (path if path != "/" else "/overview"), guarded(data, True)))
    for path, do in ACTIONS:
        json_act, form_act = console.acting(do)
        post = ["POST"]
        routes.append(Route("/api" + path, guarded(json_act, True, "act"), methods=post))
        routes.append(Route("/actions" + path, guarded(form_act, False, "act"), methods=post))
    result_api, _ = console.reading(task.result, "task.html")
    routes += [
        Route("/api/tasks/{id}/result", guarded(result_api, True)),
        Route("/api/tasks", guarded(serve(api.enqueue), True, "enqueue"), methods=["POST"]),
        Route("/find", guarded(serve(task.find), api=False)),
        Route("/login", serve(session.login_page)),
        Route("/login", serve(session.login), methods=["POST"]),
        Route("/logout", serve(session.logout), methods=["POST"]),
        Route("/healthz", serve(health.healthz)),
        Route("/favicon.svg", serve(icon.icon)),
        Route("/favicon.ico", serve(icon.icon)),
        Route("/readyz", serve(health.readyz)),
        Route("/metrics", guarded(serve(health.metrics), api=True, scope="metrics")),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await run_in_threadpool(console.conns.close)

    middleware = [
        Middleware(TrustedHostMiddleware, allowed_hosts=settings.console_hosts),
        Middleware(SecurityHeaders),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, max_body_size=MAX_BODY, middleware=middleware)
    app.state.console = console
    return app
