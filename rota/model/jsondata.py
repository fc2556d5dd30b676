"""Values as JSON sees them, for the CLI's --json and the console's API."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any
from uuid import UUID


def plain(value: Any) -> Any:
    """JSON-ready: dataclasses as objects, times as ISO text, ids as text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(plain(k)): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    return value
