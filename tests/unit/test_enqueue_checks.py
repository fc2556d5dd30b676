"""An enqueue's checks live in one place (rota.model.calls.check_call) and
run once per call: every check is visited once, and nothing calls back into
the App while a batch is checked."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import pytest

import rota
from rota import workflow
from rota.model import calls
from rota.settings import Settings

# What check_call runs of rota.model.*, each once per call.
CHECKS = ["check_run", "check_priority", "check_queue_allowed", "task_id_of", "envelope_template"]


@pytest.fixture
def app() -> rota.App:
    application = rota.App(
        Settings(database_url="postgresql://u:pw@nowhere/db", queues="pdfs,urgent")
    )

    @application.task(queue="pdfs", limit=rota.Limit("per-path", concurrency=2, per="{path}"))
    def parse(path: str, pages: int = 1) -> None: ...

    return application


@pytest.fixture
def visits(monkeypatch: pytest.MonkeyPatch, app: rota.App) -> collections.Counter[str]:
    counted: collections.Counter[str] = collections.Counter()

    def counting(name: str, check: Callable[..., Any]) -> Callable[..., Any]:
        def visit(*args: Any, **kwargs: Any) -> Any:
            counted[name] += 1
            return check(*args, **kwargs)

        return visit

    for name in CHECKS:
        monkeypatch.setattr(calls, name, counting(name, getattr(calls, name)))
    key = rota.Limit.key
    monkeypatch.setattr(rota.Limit, "key", counting("limit_key", key))

    def no_call_back(*_args: Any) -> None:
        raise AssertionError("a batch's checks called back into the App")

    monkeypatch.setattr(app, "check_queue_allowed", no_call_back)
    monkeypatch.setattr(app, "task_id_of", no_call_back)
    return counted


def test_each_check_of_a_call_runs_once(app: rota.App, visits: collections.Counter[str]) -> None:
    call = app.prepare(
        "parse",
        ["a.pdf"],
        tenant="alice",
        queue="urgent",  # another queue than the task's: a template of its own
        countdown=5,
        idempotency_key="k1",
        priority=3,
    )
    batch = app.batch([call])
    assert dict(visits) == dict.fromkeys([*CHECKS, "limit_key"], 1)
    assert len(batch) == 1 and batch.limit_keys == ["per-path/a.pdf"]
    assert batch.ids[0] == calls.task_id_for_key("k1", "alice")


def test_a_workflow_checks_its_calls_the_same_way(
    app: rota.App, visits: collections.Counter[str]
) -> None:
    parse = app.tasks["parse"]
    flow = rota.chain(parse.using(tenant="alice").prepare("a.pdf"))
    _op, stored, batch = workflow._prepared(app, flow)
    assert list(batch.ids) == stored.ids
    assert visits["check_run"] == 1 and visits["limit_key"] == 1
