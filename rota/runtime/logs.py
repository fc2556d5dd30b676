"""Logging for the long-running commands: `--log-level`, and `--log-format
json` for log collectors (one JSON object per line)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from rota.errors import ValidationError
from rota.runtime.redact import redact

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")


class TextFormatter(logging.Formatter):
    """One line per record (its traceback below), secrets masked."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        if record.exc_info:
            entry["traceback"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry)


def configure(level: str = "info", fmt: str = "text") -> None:
    if level not in LEVELS:
        raise ValidationError(f"--log-level takes {', '.join(LEVELS)}, got {level!r}")
    if fmt not in FORMATS:
        raise ValidationError(f"--log-format takes {', '.join(FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # psycopg_pool (the console's connections) says at INFO what each request
    # for a connection does: below debug, only its warnings.
    pool_level = logging.NOTSET if level == "debug" else logging.WARNING
    logging.getLogger("psycopg.pool").setLevel(pool_level)
