"""A Lambda-style entry point: drain the buffer within the invocation's time."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from rota.loader.engine import Loader
from rota.settings import Settings

# Stop this long before the platform's deadline: one pass must still finish.
SAFETY_MARGIN_SECONDS = 5.0


class LambdaContext(Protocol):
    def get_remaining_time_in_millis(self) -> int: ...


def lambda_handler(event: dict[str, Any] | None, context: LambdaContext | None) -> dict[str, Any]:
    """Drains until the buffer is empty or the invocation is about to time out.
    `event` may carry {"max_seconds": N} to stop sooner."""
    budget: float | None = None
    if context is not None:
        budget = max(0.0, context.get_remaining_time_in_millis() / 1000 - SAFETY_MARGIN_SECONDS)
    if event and event.get("max_seconds") is not None:
        limit = float(event["max_seconds"])
        budget = limit if budget is None else min(budget, limit)
    loader = Loader(Settings())
    try:
        summary = loader.drain(max_seconds=budget)
    finally:
        loader.close()
    return {**dataclasses.asdict(summary), "exit_code": summary.exit_code}
