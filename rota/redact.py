"""Secrets out of what is printed: URLs with their passwords masked."""

from __future__ import annotations

import re

# scheme://user:password@host -> scheme://user:***@host; also a conninfo's
# password=... and a URL's ?password=... parameter.
_USERINFO = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^@\s]*(?P<at>@)")
_PARAM = re.compile(r"(?P<head>\bpassword\s*=\s*)('[^']*'|[^\s&]+)", re.IGNORECASE)


def redact_url(value: object) -> object:
    """`value` with any password in it replaced by ***; non-strings unchanged."""
    if not isinstance(value, str):
        return value
    return redact(value)


def redact(text: str) -> str:
    text = _USERINFO.sub(r"\g<head>***\g<at>", text)
    return _PARAM.sub(r"\g<head>***", text)
