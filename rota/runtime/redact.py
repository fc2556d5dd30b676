"""Secrets out of everything rota prints, logs, stores or answers: the one
redaction used by logs (text and JSON), CLI errors, the console and its API,
and the errors and tracebacks stored with failed tasks; and text made safe
for a terminal.

Masked: a URL's password (`scheme://user:***@host`, whatever `@` or `:` the
password holds), `key=value` and `"key": "value"` pairs whose key names a
secret (password, passwd, pwd, secret, token, api_key, access_key, ...,
quoted values whole), and `Authorization: Bearer ...` credentials.
"""

from __future__ import annotations

import re

# scheme://user:password@host: the password runs to the last `@` of the
# URL (before any space or quote), so `@` and `:` inside it are masked too.
_USERINFO = re.compile(
    r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s'\"]*:)[^\s'\"]*(?P<at>@)(?=[^@\s'\"]*(?:[\s'\"]|$))"
)
_SECRET_KEYS = (
    r"password|passwd|pwd|secret|secret_key|token|access_token|refresh_token|api_?key|"
    r"access_key|private_key|client_secret|auth_token|dashboard_token"
)
# key=value, key: value, "key": "value", key='va lue' (conninfo, query
# strings, JSON, Python reprs); the key may be prefixed (ROTA_..., db_...).
_PAIR = re.compile(
    r"(?P<head>\b[\w.-]*(?:" + _SECRET_KEYS + r")[\"']?\s*[=:]\s*)"
    r"(?P<value>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|[^\s&,;)}\]]+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<head>\b(?:Bearer|Basic)\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)
# Terminal control: escape sequences and control characters but newline and tab.
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _mask(match: re.Match[str]) -> str:
    value = match.group("value")
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{match.group('head')}{quote}***{quote}"


def redact(text: str) -> str:
    """`text` with every secret it shows masked."""
    text = _USERINFO.sub(r"\g<head>***\g<at>", text)
    text = _PAIR.sub(_mask, text)
    return _BEARER.sub(r"\g<head>***", text)


def redact_url(value: object) -> object:
    """`value` with any password in it replaced by ***; non-strings unchanged."""
    if not isinstance(value, str):
        return value
    return redact(value)


def printable(text: str) -> str:
    """`text` safe for a terminal: escape sequences and control characters
    (but newlines and tabs) removed, so stored text cannot drive it."""
    return _CONTROL.sub("", text)
