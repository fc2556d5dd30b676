"""Drives effect generators: logic written once, run by a sync or an async caller.

A flow is a generator that yields requests (a statement to run, a Redis write)
and receives their results, or their exceptions thrown back in. `drive` and
`adrive` carry the requests out with a sync or an async handler; rota.core.db and
the producer are both written this way, so no logic exists in two copies.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

Request = TypeVar("Request")
Result = TypeVar("Result")


def drive(flow: Generator[Request, Any, Result], handle: Callable[[Request], Any]) -> Result:
    try:
        request = next(flow)
        while True:
            try:
                outcome = handle(request)
            except Exception as exc:
                request = flow.throw(exc)
            else:
                request = flow.send(outcome)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def adrive(
    flow: Generator[Request, Any, Result], handle: Callable[[Request], Awaitable[Any]]
) -> Result:
    try:
        request = next(flow)
        while True:
            try:
                outcome = await handle(request)
            except Exception as exc:
                request = flow.throw(exc)
            else:
                request = flow.send(outcome)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
