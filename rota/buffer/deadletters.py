"""The buffer's dead-letter stream: what the loaders could not load, with why.

Each dead letter holds the raw data (a whole task's JSON, an entry's task
columns, or an unreadable entry's fields), the reason, and where it came
from. Operators list them here, and replay or purge them (rota.loader.replay,
which records both actions in rota.audit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from rota.buffer.redis_client import Client
from rota.buffer.streams import check_entry_id, dead_letter_stream, entry_seconds
from rota.errors import ValidationError

# Dead letters searched for a task id at most (newest first).
SEARCH_MAX = 10_000
MAX_LIST = 1000


@dataclass(frozen=True)
class DeadLetter:
    id: str
    at: datetime
    reason: str
    stream: str  # the shard it was read from
    entry: str  # its entry id there
    raw: str
    task_ids: list[str] = field(default_factory=list)


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _task_ids(raw: bytes) -> list[str]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    ids = data.get("id") if isinstance(data, dict) else None
    if isinstance(ids, str):
        return [ids]
    if isinstance(ids, list):
        return [i for i in ids if isinstance(i, str)]
    return []


def _letter(entry_id: bytes | str, fields: dict[bytes, bytes]) -> DeadLetter:
    text_id = _text(entry_id)
    raw = fields.get(b"raw", b"")
    return DeadLetter(
        text_id,
        datetime.fromtimestamp(entry_seconds(text_id), UTC),
        _text(fields.get(b"reason")),
        _text(fields.get(b"stream")),
        _text(fields.get(b"entry")),
        _text(raw),
        _task_ids(raw),
    )


def count(client: Client, prefix: str) -> int:
    return int(client.xlen(dead_letter_stream(prefix)))


def newest(
    client: Client, prefix: str, limit: int = 50, before: str | None = None
) -> list[DeadLetter]:
    """Dead letters, newest first (`before`: an id, for the next page)."""
    if not 1 <= limit <= MAX_LIST:
        raise ValidationError(f"limit must be from 1 to {MAX_LIST}, got {limit}")
    top = f"({check_entry_id(before)}" if before else "+"
    entries: Any = client.xrevrange(dead_letter_stream(prefix), max=top, min="-", count=limit)
    return [_letter(entry_id, fields) for entry_id, fields in entries]


def get(client: Client, prefix: str, letter_id: str) -> DeadLetter | None:
    check_entry_id(letter_id)
    entries: Any = client.xrange(dead_letter_stream(prefix), min=letter_id, max=letter_id)
    return next((_letter(entry_id, fields) for entry_id, fields in entries), None)


def find_task(client: Client, prefix: str, task_id: str) -> DeadLetter | None:
    """The newest dead letter that holds the task, among the last SEARCH_MAX."""
    needle = task_id.encode()
    last: str | None = None
    seen = 0
    while seen < SEARCH_MAX:
        top = f"({last}" if last else "+"
        entries: Any = client.xrevrange(dead_letter_stream(prefix), max=top, min="-", count=500)
        if not entries:
            return None
        for entry_id, fields in entries:
            if needle in fields.get(b"raw", b""):
                return _letter(entry_id, fields)
            last = _text(entry_id)  # the next page starts below the oldest read
        seen += len(entries)
    return None
