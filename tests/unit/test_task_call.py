"""A run made by `Task.using(...).prepare(...)` (built on the producer's hot
path without the dataclass's __init__) is the TaskCall its fields make."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

import rota
from rota.task import TaskCall


def new_settings() -> rota.Settings:
    return rota.Settings(
        database_url="postgresql://u:pw@db.invalid/app", redis_url="redis://redis.invalid:6379/0"
    )


def test_a_prepared_run_is_the_task_call_of_its_fields() -> None:
    app = rota.App(new_settings())

    @app.task(queue="mail")
    def send(to: str, *, urgent: bool = False) -> None: ...

    eta = datetime(2030, 1, 1, tzinfo=UTC)
    cases = [
        (send.using(tenant="acme"), ("acme", None, None, None, None, None)),
        (
            send.using(tenant="b", eta=eta, cost=2.5, idempotency_key="k", priority=7),
            ("b", eta, None, 2.5, "k", 7),
        ),
        (send.using(tenant="c", countdown=30.0), ("c", None, 30.0, None, None, None)),
    ]
    for enqueue, (tenant, at, countdown, cost, key, priority) in cases:
        made = enqueue.prepare("x@example.com", urgent=True)
        built = TaskCall(
            send.name,
            tenant,
            ("x@example.com",),
            {"urgent": True},
            "mail",
            at,
            countdown,
            cost,
            key,
            priority,
            send,
            False,
        )
        assert made == built and repr(made) == repr(built)
        # Every field, those left out of comparisons too, and no other attribute.
        for f in dataclasses.fields(TaskCall):
            assert getattr(made, f.name) == getattr(built, f.name), f.name
        assert set(vars(made)) == {f.name for f in dataclasses.fields(TaskCall)}
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.tenant = "other"  # type: ignore[misc]
        assert dataclasses.replace(made, receives=True).receives is True
    assert send.using(tenant="d").receiving("y").receives is True
