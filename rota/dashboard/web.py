"""What every console page shares: who may do what (the guard, around each
handler), how a page is rendered, and the adapters that turn a page's plain
functions into HTTP handlers, `reading` (a JSON answer and the page that
shows it) and `acting` (a JSON action and its form-post twin)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeAlias
from urllib.parse import quote, urlencode

import psycopg
from pydantic import SecretStr
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates

from rota.buffer import redis_client
from rota.core import db, history
from rota.dashboard.auth import (
    COOKIE,
    CSRF_FIELD,
    SCOPES,
    Guard,
    Principal,
    read_tokens,
    token_hash,
)
from rota.dashboard.charts import svg
from rota.dashboard.data import Connections, figures
from rota.errors import EnqueueError, RotaError
from rota.readmodel.metrics import overview_registry
from rota.runtime.redact import redact
from rota.settings import Settings

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
TEMPLATES.env.globals["chart"] = svg
TEMPLATES.env.globals["fair_wording"] = history.wording
REFRESH_SECONDS = 5
PER_PAGE = 50
# A server out of reach: the page says so (503), and to try again.
UNAVAILABLE: tuple[type[Exception], ...] = (*db.SERVER_LOST, *redis_client.SERVER_LOST)

Handler: TypeAlias = Callable[[Request], Awaitable[Response]]
# A page's read: its data, or None for "not found".
Fetch: TypeAlias = Callable[[Request, Connections], "dict[str, Any] | None"]
# An action: the request, its body (JSON, or a form's fields), the servers,
# and who acts (the audit log's actor).
Do: TypeAlias = Callable[[Request, "dict[str, Any]", Connections, str], "dict[str, Any]"]
# A handler answering with a response of its own (logins, health, enqueue).
Own: TypeAlias = Callable[[Request, "Console"], Awaitable[Response]]


def whole(request: Request, name: str, default: int) -> int:
    """A query parameter that is a whole number."""
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise RotaError(f"{name} must be a whole number") from None


def text(request: Request, name: str) -> str | None:
    """A query parameter, stripped (None when empty)."""
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


class Console:
    """The console's settings, guard, servers and metrics registry (its
    /metrics and `rota dashboard --metrics-port` serve it), and the wrapping
    every handler gets."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.guard = guard_for(settings)
        self.conns = Connections(settings)
        self.registry = overview_registry(lambda: figures(self.conns), process=True)

    def actor(self, request: Request) -> str:
        principal = self.guard.who(request)
        return f"console:{principal.name if principal else 'unknown'}"

    def page(
        self, request: Request, name: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        principal = self.guard.who(request)
        context = {
            "can_act": principal is not None and "act" in principal.scopes,
            "csrf": self.guard.csrf_value(request),
            "nonce": getattr(request.state, "nonce", ""),
            "logged_in": bool(request.cookies.get(COOKIE)),
            "csrf_field": CSRF_FIELD,
            "refresh": REFRESH_SECONDS,
            "quote": quote,
            "urlencode": urlencode,
            **context,
        }
        return TEMPLATES.TemplateResponse(request, name, context, status_code=status)

    def serving(self, handler: Own) -> Handler:
        """A handler of a response of its own, given the console."""

        async def run(request: Request) -> Response:
            return await handler(request, self)

        return run

    def guarded(self, handler: Handler, api: bool, scope: str = "read") -> Handler:
        """Checks who may do `scope` (an action's, `act`, is checked with its
        body), and turns the errors a bad day brings into a clear answer (400
        for bad input, 503 for a server down)."""

        async def run(request: Request) -> Response:
            if self.guard.who(request) is None:
                if api:
                    return JSONResponse({"error": "a token is required"}, status_code=401)
                return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)
            if scope != "act":
                why = self.guard.check(request, scope)
                if why is not None:
                    if api:
                        return JSONResponse({"error": f"refused: {why}"}, status_code=403)
                    return self.page(request, "error.html", {"message": f"refused: {why}"}, 403)
            try:
                return await handler(request)
            except EnqueueError as exc:
                status, message = 503, redact(str(exc))
            except RotaError as exc:
                status, message = 400, redact(str(exc))
            except psycopg.errors.QueryCanceled:
                limit = self.settings.console_statement_timeout_seconds
                status, message = (
                    503,
                    (
                        "PostgreSQL took longer than ROTA_CONSOLE_STATEMENT_TIMEOUT_SECONDS "
                        f"({limit:g} s): try again, or narrow it"
                    ),
                )
            except UNAVAILABLE as exc:
                status, message = 503, f"a server is unavailable: {type(exc).__name__}"
            if api:
                return JSONResponse({"error": message}, status_code=status)
            return self.page(request, "error.html", {"message": message}, status)

        return run

    def reading(self, fetch: Fetch, template: str) -> tuple[Handler, Handler]:
        """An API endpoint and the page that shows the same data."""

        async def api(request: Request) -> Response:
            found = await run_in_threadpool(fetch, request, self.conns)
            if found is None:
                return JSONResponse({"error": "not found"}, status_code=404)
            return JSONResponse(found)

        async def html(request: Request) -> Response:
            found = await run_in_threadpool(fetch, request, self.conns)
            if found is None:
                return self.page(request, "error.html", {"message": "not found"}, 404)
            return self.page(request, template, found)

        return api, html

    def acting(self, do: Do) -> tuple[Handler, Handler]:
        """An API action (JSON body) and its form-post twin (redirects back)."""

        async def api(request: Request) -> Response:
            body: Any = {}
            if await request.body():
                try:
                    body = await request.json()
                except (ValueError, RecursionError):  # not JSON, not UTF-8, too deep
                    return JSONResponse({"error": "the body is not JSON"}, status_code=400)
            why = self.guard.check(request, "act")
            if why is not None:
                return JSONResponse({"error": f"refused: {why}"}, status_code=403)
            if not isinstance(body, dict):
                return JSONResponse({"error": "the body must be a JSON object"}, status_code=400)
            result = await run_in_threadpool(do, request, body, self.conns, self.actor(request))
            self.conns.recent.clear()
            return JSONResponse(result)

        async def form(request: Request) -> Response:
            fields = await request.form()
            why = self.guard.check(request, "act", str(fields.get(CSRF_FIELD, "")))
            if why is not None:
                return self.page(request, "error.html", {"message": f"refused: {why}"}, 403)
            body = {k: fields.getlist(k) if k == "ids" else fields.get(k) for k in fields}
            result = await run_in_threadpool(do, request, body, self.conns, self.actor(request))
            self.conns.recent.clear()
            back = str(fields.get("back") or "/")
            if not back.startswith("/") or back.startswith("//"):
                back = "/"
            sep = "&" if "?" in back else "?"
            return RedirectResponse(f"{back}{sep}done={quote(json.dumps(result)[:300])}", 303)

        return api, form
