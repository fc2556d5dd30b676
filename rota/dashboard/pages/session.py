"""Logging in (a token for a session cookie) and out."""

from __future__ import annotations

import hmac

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from rota.dashboard.auth import COOKIE, CSRF_FIELD, CSRF_HEADER
from rota.dashboard.web import Console


async def login_page(request: Request, console: Console) -> Response:
    return console.page(request, "login.html", {"next": request.query_params.get("next", "/")})


async def login(request: Request, console: Console) -> Response:
    fields = await request.form()
    nxt = str(fields.get("next") or "/")
    if not nxt.startswith("/") or nxt.startswith("//"):
        nxt = "/"
    client = request.client.host if request.client else "unknown"
    found = console.guard.login(str(fields.get("token", "")), client)
    if isinstance(found, str):
        status = 429 if found.startswith("too many") else 401
        return console.page(request, "login.html", {"next": nxt, "wrong": found}, status)
    response = RedirectResponse(nxt, status_code=303)
    response.set_cookie(
        COOKIE,
        console.guard.session_value(found),
        max_age=int(console.settings.console_session_seconds),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


async def logout(request: Request, console: Console) -> Response:
    fields = await request.form()
    given = str(fields.get(CSRF_FIELD, "")) or request.headers.get(CSRF_HEADER, "")
    expected = console.guard.csrf_value(request)
    if expected and not hmac.compare_digest(
        given.encode("utf-8", "surrogateescape"), expected.encode()
    ):
        return console.page(request, "error.html", {"message": "refused: a wrong CSRF token"}, 403)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE)
    return response
