"""Who may read and act in the console, and how much.

Tokens have names and scopes: `read` (pages and the API's reads), `enqueue`
(POST /api/tasks), `act` (retry, cancel, pause, resume, limits, replay,
purge) and `metrics` (/metrics). ROTA_DASHBOARD_TOKEN is one token with every
scope, named "token"; ROTA_CONSOLE_TOKENS_FILE holds more, one per line,
`NAME SCOPES SHA256` (`rota dashboard-token NAME --scopes read,metrics`
makes one): only their hashes are stored. The audit log records the token's
name as the actor.

Without any token the console serves loopback only (the CLI refuses any
other bind) and may read and be scraped, never act. With tokens, every
request but the health checks and the login needs one: `Authorization:
Bearer TOKEN` (scripts, Prometheus), or the session cookie a login sets
(browsers; it expires after ROTA_CONSOLE_SESSION_SECONDS). A browser's POST
also carries a CSRF token tied to its session, and an Origin, if any, that
is the console's own. Logins from one address are throttled after a few
failures.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request

from rota.errors import ValidationError

COOKIE = "rota_session"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
SCOPES = ("read", "enqueue", "act", "metrics")
# Failed logins from one address within the window, before it must wait.
LOGIN_FAILURES = 5
LOGIN_WINDOW_SECONDS = 60.0


@dataclass(frozen=True)
class Principal:
    """Who a request is: a token's name and what it may do."""

    name: str
    scopes: frozenset[str]


# No token configured: loopback readers and scrapers, who never act.
LOOPBACK = Principal("loopback", frozenset({"read", "metrics"}))


def _same(given: str, expected: str) -> bool:
    """Constant-time, whatever characters `given` holds."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def parse_scopes(text: str) -> frozenset[str]:
    scopes = frozenset(s.strip() for s in text.split(",") if s.strip())
    unknown = scopes - set(SCOPES)
    if not scopes or unknown:
        raise ValidationError(
            f"scopes must be some of {', '.join(SCOPES)} (comma-separated), got {text!r}"
        )
    return scopes


def read_tokens(path: Path) -> dict[str, Principal]:
    """The tokens file: {sha256: principal}. Blank lines and # comments are
    skipped; a bad line is an error naming it."""
    found: dict[str, Principal] = {}
    names: set[str] = set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3 or len(parts[2]) != 64:
            raise ValidationError(
                f"{path}:{number}: expected `NAME SCOPES SHA256` "
                "(make a line with `rota dashboard-token NAME --scopes ...`)"
            )
        name, scopes, digest = parts
        try:
            int(digest, 16)
        except ValueError:
            raise ValidationError(f"{path}:{number}: the hash is not hexadecimal") from None
        if name in names:
            raise ValidationError(f"{path}:{number}: the name {name!r} is used twice")
        names.add(name)
        found[digest.lower()] = Principal(name, parse_scopes(scopes))
    return found


class Guard:
    def __init__(
        self,
        tokens: dict[str, Principal],
        session_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tokens = tokens  # {sha256 of the token: who it is}
        self.by_name = {p.name: p for p in tokens.values()}
        self.session_seconds = session_seconds
        self.clock = clock
        # Sessions and CSRF tokens are signed with a key of this process:
        # a restart logs everyone out.
        self._key = secrets.token_bytes(32)
        self._failures: dict[str, collections.deque[float]] = {}
        self._lock = threading.Lock()

    @property
    def open(self) -> bool:
        """No token configured: loopback only, read-only."""
        return not self.tokens

    def _mac(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def _bearer(self, request: Request) -> Principal | None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return None
        return self.tokens.get(token_hash(given.strip()))

    def _session(self, request: Request) -> Principal | None:
        name, _, rest = request.cookies.get(COOKIE, "").partition(":")
        expires, _, mac = rest.partition(":")
        if not _same(mac, self._mac(f"session:{name}:{expires}")):
            return None
        try:
            if float(expires) < self.clock():
                return None
        except ValueError:
            return None
        return self.by_name.get(name)

    def who(self, request: Request) -> Principal | None:
        """Who the request is (None: nobody the console knows)."""
        if self.open:
            return LOOPBACK
        return self._bearer(request) or self._session(request)

    def session_value(self, principal: Principal) -> str:
        expires = f"{self.clock() + self.session_seconds:.0f}"
        return f"{principal.name}:{expires}:{self._mac(f'session:{principal.name}:{expires}')}"

    def csrf_value(self, request: Request) -> str:
        """The CSRF token of the request's session ("" without one)."""
        cookie = request.cookies.get(COOKIE, "")
        return self._mac(f"csrf:{cookie}") if cookie and self._session(request) else ""

    def login(self, given: str, client: str) -> Principal | str:
        """The token's principal, or why not (wrong, or too many tries)."""
        now = self.clock()
        with self._lock:
            failures = self._failures.setdefault(client, collections.deque())
            while failures and failures[0] < now - LOGIN_WINDOW_SECONDS:
                failures.popleft()
            if len(failures) >= LOGIN_FAILURES:
                return f"too many failed logins: try again in {LOGIN_WINDOW_SECONDS:.0f} s"
            principal = self.tokens.get(token_hash(given)) if given else None
            if principal is None:
                failures.append(now)
                return "wrong token"
            failures.clear()
            return principal

    def check(self, request: Request, scope: str, form_csrf: str | None = None) -> str | None:
        """None if the request may do `scope`, else why not."""
        principal = self.who(request)
        if principal is None:
            return "log in first"
        if scope not in principal.scopes:
            if self.open:
                return (
                    f"{scope} needs a token: set ROTA_DASHBOARD_TOKEN or "
                    "ROTA_CONSOLE_TOKENS_FILE where the console runs"
                )
            return f"the token {principal.name!r} may not {scope}"
        if scope in ("act", "enqueue") and self._bearer(request) is None:
            # A browser's session: the post must come from the console's own page.
            origin = request.headers.get("origin")
            own = f"{request.url.scheme}://{request.url.netloc}"
            if origin is not None and origin != own:
                return "a request from another site"
            given = form_csrf or request.headers.get(CSRF_HEADER, "")
            if not _same(given, self.csrf_value(request)):
                return "a missing or wrong CSRF token"
        return None
