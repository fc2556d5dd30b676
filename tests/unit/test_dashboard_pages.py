"""The console's page handlers, each alone: a request in, plain data out
(the servers faked), and the wrapping they share (rota.dashboard.web)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.testclient import TestClient

from rota import Settings
from rota.dashboard import data
from rota.dashboard.pages import dead, overview, task, tenant, workers
from rota.dashboard.web import Console
from rota.errors import RotaError, ValidationError


def request(query: str = "", **path_params: str) -> Request:
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "headers": [],
        "query_string": query.encode(),
        "path_params": path_params,
    }
    return Request(scope)


class Down:
    """Connections to servers that are all down."""

    settings = Settings()
    recent = data.Recent(0.0)

    @contextlib.contextmanager
    def postgres(self) -> Iterator[Any]:
        raise psycopg.OperationalError("connection refused")
        yield

    @property
    def redis(self) -> Any:
        raise redis.ConnectionError("connection refused")


def down() -> data.Connections:
    conns: Any = Down()
    return conns


def test_the_overview_says_which_servers_are_down() -> None:
    found = overview.overview(request(), down())
    assert set(found["unavailable"]) == {"postgresql", "redis"}
    assert "connection refused" in found["unavailable"]["postgresql"]
    assert found["queues"] == [] and found["dead_letters"] is None


def test_the_tenants_page_reads_its_query(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[Any, ...]] = []
    monkeypatch.setattr(data, "tenants", lambda c, *args: asked.append(args) or {})
    monkeypatch.setattr(data, "key_limits", lambda c: {"key_limits": []})
    tenant.tenants(request(), down())
    tenant.tenants(request("sort=name&order=asc&prefix=ac&page=3&per_page=9999"), down())
    tenant.tenants(request("per_page=0&page="), down())
    assert asked == [
        ("waiting", True, "", 1, 50),
        ("name", False, "ac", 3, 500),
        ("waiting", True, "", 1, 1),
    ]
    with pytest.raises(RotaError, match="page must be a whole number"):
        tenant.tenants(request("page=two"), down())


def test_the_tasks_page_reads_its_query(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[Any, ...]] = []
    monkeypatch.setattr(data, "tasks", lambda c, *args: asked.append(args) or {})
    task.tasks(request(), down())
    task.tasks(request("state=dead&tenant=+acme+&queue=&limit=5000&page=3"), down())
    assert asked == [("ready", None, None, 1, 50), ("dead", "acme", None, 3, 1000)]


def test_a_tasks_ids_come_from_the_path_or_the_body() -> None:
    one = uuid.uuid4()
    assert task.ids_of(request(id=str(one)), {"ids": ["ignored"]}) == [one]
    assert task.ids_of(request(), {"ids": [str(one)]}) == [one]
    for bad in ({}, {"ids": []}, {"ids": "x"}):
        with pytest.raises(RotaError, match="non-empty list"):
            task.ids_of(request(), bad)
    with pytest.raises(ValidationError, match="is not a task id"):
        task.ids_of(request(id="nope"), {})


def test_a_tenants_limits_from_a_form_or_json() -> None:
    form = {
        "csrf": "x",
        "back": "/t",
        "weight": "2.5",
        "concurrency_limit": "3.0",
        "capacity": " ",
        "rate_limit": 4,
    }
    assert tenant.changes(form) == {
        "weight": 2.5,
        "concurrency_limit": 3,
        "capacity": None,
        "rate_limit": 4,
    }
    assert isinstance(tenant.changes(form)["concurrency_limit"], int)
    with pytest.raises(RotaError, match="weight must be a number"):
        tenant.changes({"weight": "heavy"})


def test_dead_letter_ids_are_strings() -> None:
    assert dead.letter_ids({"ids": ["1-0", "2-0"]}) == ["1-0", "2-0"]
    assert dead.letter_ids({}) == []
    with pytest.raises(RotaError, match="dead letter ids"):
        dead.letter_ids({"ids": [1]})


def test_the_workers_page_adds_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "workers", lambda c: {"workers": [1]})
    monkeypatch.setattr(data, "audit", lambda c, limit: {"audit": [limit]})
    assert workers.workers(request(), down()) == {"workers": [1], "audit": [workers.AUDIT_ENTRIES]}


def test_the_wrapping_answers_not_found_bad_input_and_servers_down() -> None:
    console = Console(Settings())

    def fetch(request: Request, c: data.Connections) -> dict[str, Any] | None:
        what = request.query_params.get("what")
        if what == "bad":
            raise ValidationError("bad input")
        if what == "down":
            raise psycopg.OperationalError("gone")
        return None if what == "none" else {"what": what}

    json_read, _ = console.reading(fetch, "overview.html")
    app = Starlette(routes=[Route("/api/x", console.guarded(json_read, api=True))])
    with TestClient(app) as client:
        assert client.get("/api/x?what=ok").json() == {"what": "ok"}
        missing = client.get("/api/x?what=none")
        assert (missing.status_code, missing.json()) == (404, {"error": "not found"})
        bad = client.get("/api/x?what=bad")
        assert (bad.status_code, bad.json()) == (400, {"error": "bad input"})
        gone = client.get("/api/x?what=down")
        assert gone.status_code == 503 and "unavailable: OperationalError" in gone.json()["error"]
