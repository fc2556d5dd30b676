"""Who may read and act in the console.

Without ROTA_DASHBOARD_TOKEN the console serves loopback only (the CLI
refuses any other bind) and cannot act. With it, every request but the
health checks and the login needs the token: `Authorization: Bearer TOKEN`
(scripts, Prometheus), or the session cookie a login sets (browsers). A
browser's POST also carries a CSRF token tied to the session, and an Origin,
if any, that is the console's own: a page elsewhere cannot act through a
logged-in browser.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.requests import Request

COOKIE = "rota_session"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"


class Guard:
    def __init__(self, token: str | None) -> None:
        self.token = token

    def _derive(self, purpose: str) -> str:
        assert self.token is not None
        return hmac.new(self.token.encode(), purpose.encode(), hashlib.sha256).hexdigest()

    @property
    def can_act(self) -> bool:
        return self.token is not None

    def session_value(self) -> str:
        return self._derive("session")

    def csrf_value(self) -> str:
        return self._derive("csrf") if self.token else ""

    def bearer(self, request: Request) -> bool:
        if self.token is None:
            return False
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip(), self.token)

    def session(self, request: Request) -> bool:
        if self.token is None:
            return False
        return hmac.compare_digest(request.cookies.get(COOKIE, ""), self.session_value())

    def may_read(self, request: Request) -> bool:
        return self.token is None or self.bearer(request) or self.session(request)

    def login(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given, self.token)

    def may_act(self, request: Request, form_csrf: str | None = None) -> str | None:
        """None if the request may act, else why not."""
        if self.token is None:
            return "actions need ROTA_DASHBOARD_TOKEN set where the console runs"
        if self.bearer(request):
            return None  # a script: no browser sends this header across sites
        if not self.session(request):
            return "log in first"
        origin = request.headers.get("origin")
        own = f"{request.url.scheme}://{request.url.netloc}"
        if origin is not None and origin != own:
            return "a request from another site"
        given = form_csrf or request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(given, self.csrf_value()):
            return "a missing or wrong CSRF token"
        return None
