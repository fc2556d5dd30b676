"""The one redaction: every form a secret takes in a message is masked, and
nothing else is changed."""

from __future__ import annotations

import pytest

from rota.runtime.redact import printable, redact


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://rota:pw@db:5432/app", "postgresql://rota:***@db:5432/app"),
        # `@` and `:` inside the password
        ("postgresql://u:p@ss:w@rd@db/app", "postgresql://u:***@db/app"),
        ("redis://:s3cret@cache:6379/0 refused", "redis://:***@cache:6379/0 refused"),
        ("rediss://default:a:b@h:6380", "rediss://default:***@h:6380"),
        # conninfo, quoted and not
        ("host=db password=s3cret user=u", "host=db password=*** user=u"),
        ("host=db password='a b c' user=u", "host=db password='***' user=u"),
        ('password="x y" port=5', 'password="***" port=5'),
        # query strings, JSON, Python reprs, environment
        ("?sslmode=require&password=pw&x=1", "?sslmode=require&password=***&x=1"),
        ('{"password": "pw", "user": "u"}', '{"password": "***", "user": "u"}'),
        ("{'api_key': 'k-123', 'n': 1}", "{'api_key': '***', 'n': 1}"),
        ("ROTA_DASHBOARD_TOKEN=abcdefghijklmnopq", "ROTA_DASHBOARD_TOKEN=***"),
        ("secret: hunter2", "secret: ***"),
        ("Authorization: Bearer abc.def-ghi", "Authorization: Bearer ***"),
        # a URL inside a traceback line
        (
            '  File "x.py", line 3, in f\n    connect("postgresql://u:pw@h/db")\n',
            '  File "x.py", line 3, in f\n    connect("postgresql://u:***@h/db")\n',
        ),
    ],
)
def test_secrets_are_masked(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "task 0193a5c2 (pdf.parse, tenant acme) failed on attempt 1 of 3",
        "postgresql://rota@db:5432/app",  # no password
        "http://example.com/a@b",  # no userinfo
        "ValueError: bad page 3: 12",
        "a missing or wrong CSRF token",
    ],
)
def test_text_without_secrets_is_unchanged(text: str) -> None:
    assert redact(text) == text


def test_terminal_control_is_stripped() -> None:
    hostile = "dead\x1b[2J\x1b]0;owned\x07 letter\x1b[31mred\x1b[0m\r\x00\tok\n"
    assert printable(hostile) == "dead0;owned letterred\tok\n"


def test_text_logs_are_redacted_too() -> None:
    import logging

    from rota.runtime.logs import TextFormatter

    try:
        raise OSError("cannot reach postgresql://u:pw@h/db")
    except OSError:
        import sys

        record = logging.LogRecord(
            "rota.x", logging.ERROR, __file__, 1, "password=%s", ("hunter2",), sys.exc_info()
        )
    line = TextFormatter().format(record)
    assert "hunter2" not in line and "password=***" in line
    assert "u:pw@" not in line and "postgresql://u:***@h/db" in line  # in the traceback too
