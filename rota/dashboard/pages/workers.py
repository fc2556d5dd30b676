"""Workers (/workers): the live workers, and the audit log's latest entries."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from rota.dashboard import data

AUDIT_ENTRIES = 30


def workers(request: Request, c: data.Connections) -> dict[str, Any]:
    return {**data.workers(c), **data.audit(c, AUDIT_ENTRIES)}
