"""The operations console: server-rendered pages and a JSON API over the
same data (rota.console.data), for people and for scripts in any language.

    rota dashboard --host 127.0.0.1 --port 8377
"""

from __future__ import annotations

import contextlib
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
import redis
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from rota.console import data
from rota.console.auth import (
    COOKIE,
    CSRF_FIELD,
    CSRF_HEADER,
    SCOPES,
    Guard,
    Principal,
    read_tokens,
    token_hash,
)
from rota.console.headers import SecurityHeaders
from rota.core import db, read
from rota.core.read import TASK_STATES, TENANT_SORTS
from rota.errors import EnqueueError, RotaError
from rota.readmodel.metrics import FiguresCollector, process_registry
from rota.runtime.redact import redact
from rota.settings import Settings

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
MAX_BODY = 4 * 1024 * 1024
REFRESH_SECONDS = 5
PER_PAGE = 50

Handler = Callable[[Request], Awaitable[Response]]


def _int(request: Request, name: str, default: int) -> int:
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise RotaError(f"{name} must be a whole number") from None


def _text(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()
    return value or None


def guard_for(settings: Settings) -> Guard:
    """The console's tokens: ROTA_DASHBOARD_TOKEN (every scope) and the
    tokens file's."""
    tokens: dict[str, Principal] = {}
    secret = settings.dashboard_token
    if secret is not None:
        token = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
        tokens[token_hash(token)] = Principal("token", frozenset(SCOPES))
    if settings.console_tokens_file is not None:
        tokens.update(read_tokens(settings.console_tokens_file))
    return Guard(tokens, settings.console_session_seconds)


def create_app(settings: Settings) -> Starlette:
    guard = guard_for(settings)
    conns = data.Connections(settings)
    registry = process_registry()
    registry.register(FiguresCollector(lambda: data.figures(conns)))

    def actor(request: Request) -> str:
        principal = guard.who(request)
        return f"console:{principal.name if principal else 'unknown'}"

    def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        principal = guard.who(request)
        context = {
            "can_act": principal is not None and "act" in principal.scopes,
            "csrf": guard.csrf_value(request),
            "nonce": getattr(request.state, "nonce", ""),
            "logged_in": bool(request.cookies.get(COOKIE)),
            "csrf_field": CSRF_FIELD,
            "refresh": REFRESH_SECONDS,
            "quote": quote,
            "urlencode": urlencode,
            **context,
        }
        return TEMPLATES.TemplateResponse(request, name, context, status_code=status)

    def guarded(handler: Handler, api: bool, scope: str = "read") -> Handler:
        """Checks who may do `scope` (reading, by default), and turns the
        errors a bad day brings into a clear answer (400 for bad input, 503
        for a server down)."""

        async def run(request: Request) -> Response:
            if guard.who(request) is None:
                if api:
                    return JSONResponse({"error": "a token is required"}, status_code=401)
                return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)
            if scope in ("read", "metrics"):
                why = guard.check(request, scope)
                if why is not None:
                    if api:
                        return JSONResponse({"error": f"refused: {why}"}, status_code=403)
                    return page(request, "error.html", {"message": f"refused: {why}"}, 403)
            try:
                return await handler(request)
            except EnqueueError as exc:
                status, message = 503, redact(str(exc))
            except RotaError as exc:
                status, message = 400, redact(str(exc))
            except psycopg.errors.QueryCanceled:
                limit = settings.console_statement_timeout_seconds
                status, message = (
                    503,
                    (
                        "PostgreSQL took longer than ROTA_CONSOLE_STATEMENT_TIMEOUT_SECONDS "
                        f"({limit:g} s): try again, or narrow it"
                    ),
                )
            except (psycopg.OperationalError, redis.ConnectionError, redis.TimeoutError) as exc:
                status, message = 503, f"a server is unavailable: {type(exc).__name__}"
            if api:
                return JSONResponse({"error": message}, status_code=status)
            return page(request, "error.html", {"message": message}, status)

        return run

    def reading(
        fetch: Callable[[Request], dict[str, Any] | None], template: str | None = None
    ) -> tuple[Handler, Handler | None]:
        """An API endpoint and, with a template, the page that shows it."""

        async def api(request: Request) -> Response:
            found = await run_in_threadpool(fetch, request)
            if found is None:
                return JSONResponse({"error": "not found"}, status_code=404)
            return JSONResponse(found)

        async def html(request: Request) -> Response:
            found = await run_in_threadpool(fetch, request)
            if found is None:
                return page(request, "error.html", {"message": "not found"}, 404)
            assert template is not None
            return page(request, template, found)

        return api, (html if template else None)

    def acting(do: Callable[[Request, dict[str, Any]], dict[str, Any]]) -> tuple[Handler, Handler]:
        """An API action (JSON body) and its form-post twin (redirects back)."""

        async def api(request: Request) -> Response:
            body: Any = {}
            if await request.body():
                try:
                    body = await request.json()
                except (ValueError, RecursionError):  # not JSON, not UTF-8, too deep
                    return JSONResponse({"error": "the body is not JSON"}, status_code=400)
            why = guard.check(request, "act")
            if why is not None:
                return JSONResponse({"error": f"refused: {why}"}, status_code=403)
            if not isinstance(body, dict):
                return JSONResponse({"error": "the body must be a JSON object"}, status_code=400)
            result = await run_in_threadpool(do, request, body)
            conns.recent.clear()
            return JSONResponse(result)

        async def form(request: Request) -> Response:
            fields = await request.form()
            why = guard.check(request, "act", str(fields.get(CSRF_FIELD, "")))
            if why is not None:
                return page(request, "error.html", {"message": f"refused: {why}"}, 403)
            body = {k: fields.getlist(k) if k == "ids" else fields.get(k) for k in fields}
            result = await run_in_threadpool(do, request, body)
            conns.recent.clear()
            back = str(fields.get("back") or "/")
            if not back.startswith("/") or back.startswith("//"):
                back = "/"
            sep = "&" if "?" in back else "?"
            return RedirectResponse(f"{back}{sep}done={quote(json.dumps(result)[:300])}", 303)

        return api, form

    # -- reads --------------------------------------------------------------

    def overview(request: Request) -> dict[str, Any]:
        return data.overview(conns)

    def tenants(request: Request) -> dict[str, Any]:
        sort = request.query_params.get("sort", "waiting")
        descending = request.query_params.get("order", "desc") != "asc"
        prefix = request.query_params.get("prefix", "")
        per_page = min(max(1, _int(request, "per_page", PER_PAGE)), 500)
        return data.tenants(conns, sort, descending, prefix, _int(request, "page", 1), per_page)

    def tenant(request: Request) -> dict[str, Any] | None:
        return data.tenant(conns, request.path_params["name"])

    def tasks(request: Request) -> dict[str, Any]:
        state = request.query_params.get("state", "ready")
        limit = min(max(1, _int(request, "limit", PER_PAGE)), 1000)
        return data.tasks(conns, state, _text(request, "tenant"), _text(request, "queue"), limit)

    def story(request: Request) -> dict[str, Any]:
        return data.story(conns, data.task_id(request.path_params["id"]))

    def workers(request: Request) -> dict[str, Any]:
        return {**data.workers(conns), **data.audit(conns, 30)}

    def dead_letters(request: Request) -> dict[str, Any]:
        return data.dead_letters(conns, _text(request, "before"), PER_PAGE)

    # -- actions ------------------------------------------------------------

    def ids_of(body: dict[str, Any], request: Request) -> list[Any]:
        if "id" in request.path_params:
            return [data.task_id(request.path_params["id"])]
        ids = body.get("ids") or []
        if not isinstance(ids, list) or not ids:
            raise RotaError("ids must be a non-empty list of task ids")
        return [data.task_id(str(i)) for i in ids]

    def cancel(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        return data.cancel(conns, ids_of(body, request), actor(request))

    def retry(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        return data.retry(conns, ids_of(body, request), actor(request))

    def retry_dead(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        return data.retry_dead(
            conns, actor(request), body.get("tenant") or None, body.get("queue") or None
        )

    def pauser(kind: str, paused: bool) -> Callable[[Request, dict[str, Any]], dict[str, Any]]:
        def act(request: Request, body: dict[str, Any]) -> dict[str, Any]:
            return data.pause(conns, kind, request.path_params["name"], paused, actor(request))

        return act

    def patch_tenant(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        changes = {k: v for k, v in body.items() if k not in (CSRF_FIELD, "back")}
        for key, value in list(changes.items()):
            if isinstance(value, str):  # from a form: numbers as text, "" clears
                try:
                    number = None if value.strip() == "" else float(value)
                    if key in ("concurrency_limit", "capacity") and number is not None:
                        number = int(number)
                except (ValueError, OverflowError):
                    raise RotaError(f"{key} must be a number, got {value[:40]!r}") from None
                changes[key] = number
        return data.patch_tenant(conns, request.path_params["name"], changes, actor(request))

    def replay(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        ids = body.get("ids") or []
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise RotaError("ids must be a list of dead letter ids")
        return data.replay(conns, ids, actor(request))

    def purge(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        ids = body.get("ids") or []
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise RotaError("ids must be a list of dead letter ids")
        everything = body.get("all") in (True, "true", "on")
        return data.purge(conns, ids, everything, actor(request))

    async def enqueue(request: Request) -> Response:
        why = guard.check(request, "enqueue")
        if why is not None:
            return JSONResponse({"error": f"refused: {why}"}, status_code=403)
        try:
            body = await request.json()
        except (ValueError, RecursionError):  # not JSON, not UTF-8, too deep
            return JSONResponse({"error": "the body is not JSON"}, status_code=400)
        return JSONResponse(await run_in_threadpool(data.enqueue, conns, body), status_code=201)

    # -- login, health, metrics ------------------------------------------------

    async def login_page(request: Request) -> Response:
        return page(request, "login.html", {"next": request.query_params.get("next", "/")})

    async def login(request: Request) -> Response:
        fields = await request.form()
        nxt = str(fields.get("next") or "/")
        if not nxt.startswith("/") or nxt.startswith("//"):
            nxt = "/"
        client = request.client.host if request.client else "unknown"
        found = guard.login(str(fields.get("token", "")), client)
        if isinstance(found, str):
            status = 429 if found.startswith("too many") else 401
            return page(request, "login.html", {"next": nxt, "wrong": found}, status)
        response = RedirectResponse(nxt, status_code=303)
        response.set_cookie(
            COOKIE,
            guard.session_value(found),
            max_age=int(settings.console_session_seconds),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(request: Request) -> Response:
        fields = await request.form()
        given = str(fields.get(CSRF_FIELD, "")) or request.headers.get(CSRF_HEADER, "")
        expected = guard.csrf_value(request)
        if expected and not hmac.compare_digest(
            given.encode("utf-8", "surrogateescape"), expected.encode()
        ):
            return page(request, "error.html", {"message": "refused: a wrong CSRF token"}, 403)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE)
        return response

    async def find(request: Request) -> Response:
        wanted = (request.query_params.get("id") or "").strip()
        return RedirectResponse(f"/tasks/{quote(wanted)}" if wanted else "/", status_code=303)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    def ready() -> bool:
        with conns.postgres() as conn:
            db.run(conn, read.ping())
        return True

    async def readyz(request: Request) -> Response:
        try:
            await run_in_threadpool(ready)
        except psycopg.Error:
            return PlainTextResponse("not ready: PostgreSQL unavailable\n", status_code=503)
        return PlainTextResponse("ready\n")

    async def metrics(request: Request) -> Response:
        body = await run_in_threadpool(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    routes: list[Route] = []

    def page_and_api(path: str, fetch: Callable[..., Any], template: str, api_path: str) -> None:
        api, html = reading(fetch, template)
        assert html is not None
        routes.append(Route(path, guarded(html, api=False)))
        routes.append(Route(api_path, guarded(api, api=True)))

    def act(path: str, do: Callable[[Request, dict[str, Any]], dict[str, Any]]) -> None:
        api, form = acting(do)
        routes.append(Route("/api" + path, guarded(api, api=True, scope="act"), methods=["POST"]))
        routes.append(
            Route("/actions" + path, guarded(form, api=False, scope="act"), methods=["POST"])
        )

    page_and_api("/", overview, "overview.html", "/api/overview")
    page_and_api("/tenants", tenants, "tenants.html", "/api/tenants")
    page_and_api("/tenants/{name}", tenant, "tenant.html", "/api/tenants/{name}")
    page_and_api("/tasks", tasks, "tasks.html", "/api/tasks")
    page_and_api("/tasks/{id}", story, "task.html", "/api/tasks/{id}")
    page_and_api("/workers", workers, "workers.html", "/api/workers")
    page_and_api("/dead-letters", dead_letters, "dead_letters.html", "/api/dead-letters")
    routes.append(
        Route("/api/tasks", guarded(enqueue, api=True, scope="enqueue"), methods=["POST"])
    )
    act("/tasks/{id}/cancel", cancel)
    act("/tasks/{id}/retry", retry)
    act("/tasks/cancel", cancel)
    act("/tasks/retry", retry)
    act("/dead/retry", retry_dead)
    act("/queues/{name}/pause", pauser("queue", True))
    act("/queues/{name}/resume", pauser("queue", False))
    act("/tenants/{name}/pause", pauser("tenant", True))
    act("/tenants/{name}/resume", pauser("tenant", False))
    act("/tenants/{name}", patch_tenant)
    act("/dead-letters/replay", replay)
    act("/dead-letters/purge", purge)
    routes += [
        Route("/find", guarded(find, api=False)),
        Route("/login", login_page),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", guarded(metrics, api=True, scope="metrics")),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await run_in_threadpool(conns.close)

    middleware = [
        Middleware(TrustedHostMiddleware, allowed_hosts=settings.console_hosts),
        Middleware(SecurityHeaders),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, max_body_size=MAX_BODY, middleware=middleware)
    app.state.states = TASK_STATES
    app.state.sorts = TENANT_SORTS
    return app
