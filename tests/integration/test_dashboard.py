"""The console over real servers: pages, the JSON API, enqueue over HTTP,
metrics, and the requests its token and cross-site checks must refuse."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from rota import Settings, core
from rota.core import db
from rota.dashboard.app import create_app
from rota_tools.devservers import free_port
from tests.helpers import claim, envelopes, load, wait_for

TOKEN = "s3cret-token-for-tests"
Conn = psycopg.Connection[Any]


class Console:
    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(
                create_app(settings), host="127.0.0.1", port=self.port, log_level="warning"
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Console:
        self.thread.start()
        wait_for(lambda: self.server.started, what="the console to start")
        return self

    def __exit__(self, *_: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def console(settings: Settings) -> Iterator[Console]:
    with Console(settings.model_copy(update={"dashboard_token": TOKEN})) as running:
        yield running


@pytest.fixture
def http(console: Console) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=console.url, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


@pytest.fixture
def browser(console: Console) -> Iterator[httpx.Client]:
    """A logged-in browser: the session cookie, and the CSRF token of its forms."""
    with httpx.Client(base_url=console.url, follow_redirects=False) as c:
        assert c.post("/login", data={"token": TOKEN, "next": "/"}).status_code == 303
        yield c


def csrf_of(client: httpx.Client, path: str) -> str:
    page = client.get(path).text
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "no form with a CSRF token on " + path
    return found.group(1)


def test_every_page_answers(http: httpx.Client, conn: Conn) -> None:
    load(conn, envelopes("alice", 3, queue="pdfs", max_attempts=1))
    (task,) = claim(conn, 1, queues=("pdfs",))
    db.transact(conn, core.fail([core.Failure(task.id, 1, "ValueError: bad", traceback="Tb")]))
    db.run(conn, core.refresh_stats())
    for path in [
        "/",
        "/tenants",
        "/tenants/alice",
        "/tasks?state=dead",
        "/tasks?state=ready",
        f"/tasks/{task.id}",
        "/workers",
        "/dead-letters",
    ]:
        response = http.get(path)
        assert response.status_code == 200, path
        assert "rota" in response.text
    assert "ValueError: bad" in http.get("/tasks?state=dead").text
    assert http.get("/tenants/nobody").status_code == 404
    assert http.get("/tasks/not-a-uuid").status_code == 400


def test_the_api_tells_a_tasks_story(http: httpx.Client, conn: Conn) -> None:
    load(conn, envelopes("flood", 20) + envelopes("quiet", 1))
    quiet = conn.execute("SELECT id FROM rota.tasks WHERE tenant = 'quiet'").fetchone()[0]  # type: ignore[index]
    story = http.get(f"/api/tasks/{quiet}").json()
    assert story["where"] == "ready" and story["task"]["ahead"] == 1
    assert "1 claimable tasks ahead of it" in story["why"]
    overview = http.get("/api/overview").json()
    assert overview["queues"][0]["name"] == "default"
    tenants = http.get("/api/tenants", params={"sort": "name", "order": "asc"}).json()
    assert [t["name"] for t in tenants["tenants"]] == ["flood", "quiet"]
    assert http.get("/api/tenants", params={"sort": "bogus"}).status_code == 400
    assert http.get("/api/tasks", params={"state": "ready"}).json()["tasks"][0]["tenant"] == "flood"


def test_the_tenants_page_and_api_show_the_limits_on_keys(http: httpx.Client, conn: Conn) -> None:
    from rota import Limit

    db.transact(conn, core.set_limit(Limit("stripe", concurrency=1), "ops"))
    load(conn, envelopes("acme", 3, limit_key="stripe"))
    claim(conn, 10)  # one runs, two are parked
    (stripe,) = http.get("/api/tenants").json()["key_limits"]
    assert stripe == {
        "name": "stripe",
        "concurrency": 1,
        "rate": None,
        "burst": 1.0,
        "declared": False,
        "keys": 1,
        "running": 1,
        "busiest_running": 1,
        "parked": 2,
    }
    page = http.get("/tenants").text
    assert "Limits on keys" in page and "<td>stripe</td>" in page and "operator" in page


def test_the_api_and_the_task_page_give_a_tasks_result(http: httpx.Client, conn: Conn) -> None:
    from rota.core.results import KeptResult, complete_keeping

    load(conn, envelopes("acme", 3))
    kept, refused, plain = claim(conn, 3)
    db.transact(
        conn,
        complete_keeping(
            [
                KeptResult(kept.token, '{"total": 42}', None, 3600),
                KeptResult(refused.token, None, "the result is not JSON: set", 3600),
            ]
        ),
    )
    db.transact(conn, core.complete([plain.token]))
    got = http.get(f"/api/tasks/{kept.id}/result").json()
    assert (got["status"], got["value"], got["expired"]) == ("succeeded", {"total": 42}, False)
    assert http.get(f"/api/tasks/{refused.id}/result").json()["refused"].endswith("set")
    assert http.get(f"/api/tasks/{plain.id}/result").json()["kept"] is False
    page = http.get(f"/tasks/{refused.id}").text
    assert "not kept: the result is not JSON: set" in page
    assert '{"total": 42}' in http.get(f"/tasks/{kept.id}").text
    conn.execute("UPDATE rota.results SET expires_at = now() - interval '1 s'")
    assert http.get(f"/api/tasks/{kept.id}/result").json()["expired"] is True
    missing = "00000000-0000-7000-8000-000000000000"
    assert http.get(f"/api/tasks/{missing}/result").status_code == 404
    assert "expired at" in http.get(f"/tasks/{kept.id}").text


def test_enqueue_over_http_checks_like_the_sdk(http: httpx.Client, settings: Settings) -> None:
    created = http.post(
        "/api/tasks",
        json={"name": "mail.send", "queue": "mail", "tenant": "acme", "args": ["a@b.c"]},
    )
    assert created.status_code == 201
    (task_id,) = created.json()["ids"]
    assert http.get(f"/api/tasks/{task_id}").json()["where"] == "buffer"
    many = http.post(
        "/api/tasks", json=[{"name": "x.y", "queue": "q", "tenant": f"t{i}"} for i in range(5)]
    )
    assert many.status_code == 201 and len(many.json()["ids"]) == 5
    for bad in [
        {"name": "x.y", "queue": "q"},  # no tenant
        {"name": "x.y", "queue": "q", "tenant": "bad tenant"},
        {"name": "x.y", "queue": "q", "tenant": "t", "countdown": "soon"},
        {"name": "x.y", "queue": "q", "tenant": "t", "eta": "tomorrow"},
        {"name": "x.y", "queue": "q", "tenant": "t", "args": [2**70]},  # past 64 bits
        {"name": "x.y", "queue": "q", "tenant": "t", "colour": "red"},
        [],
    ]:
        response = http.post("/api/tasks", json=bad)
        assert response.status_code == 400, bad
        assert response.json()["error"]
    assert http.post("/api/tasks", content=b"{not json").status_code == 400


def test_a_tasks_page_shows_its_priority_and_place(http: httpx.Client, conn: Conn) -> None:
    load(conn, envelopes("flood", 20))
    (urgent,) = envelopes("flood", 1, priority=4)
    load(conn, [urgent])
    page = http.get(f"/tasks/{urgent.id}").text
    assert '<td id="priority">4</td>' in page
    assert "0 claimable ahead; runs before 20 lower-priority task(s) of its tenant" in page
    story = http.get(f"/api/tasks/{urgent.id}").json()
    assert story["task"]["priority"] == 4 and "its tenant's next turn" in story["why"]


def test_enqueue_over_http_with_a_priority(http: httpx.Client, conn: Conn) -> None:
    task = {"name": "x.y", "queue": "q", "tenant": "acme", "priority": 7}
    created = http.post("/api/tasks", json=task)
    assert created.status_code == 201
    for bad in (10, -1, "7", 7.5):
        response = http.post("/api/tasks", json={**task, "priority": bad})
        assert response.status_code == 400 and "priority" in response.json()["error"], bad


def test_actions_through_the_api_are_audited(http: httpx.Client, conn: Conn) -> None:
    load(conn, envelopes("alice", 2, queue="pdfs"))
    ids = [row[0] for row in conn.execute("SELECT id FROM rota.tasks ORDER BY seq")]
    assert http.post(f"/api/tasks/{ids[0]}/cancel").json() == {
        "outcomes": {str(ids[0]): "cancelled"}
    }
    assert http.post("/api/tasks/retry", json={"ids": [str(ids[0])]}).json() == {
        "retried": [str(ids[0])]
    }
    assert http.post("/api/queues/pdfs/pause").json()["found"] is True
    assert http.post("/api/tenants/alice", json={"weight": 4}).json()["changed"] == {"weight": 4}
    actors = {row[0] for row in conn.execute("SELECT actor FROM rota.audit")}
    assert actors == {"console:token"}  # the token's name, not an address anyone can claim
    actions = [row[0] for row in conn.execute("SELECT action FROM rota.audit ORDER BY id")]
    assert actions == ["cancel", "retry", "pause", "configure"]


def test_requests_without_the_token_are_refused(console: Console, conn: Conn) -> None:
    load(conn, envelopes("alice", 1))
    (task_id,) = conn.execute("SELECT id FROM rota.tasks").fetchone()  # type: ignore[misc]
    with httpx.Client(base_url=console.url) as anonymous:
        assert anonymous.get("/api/overview").status_code == 401
        assert anonymous.get("/").status_code == 303  # to the login page
        assert anonymous.get("/metrics").status_code == 401
        assert anonymous.post(f"/api/tasks/{task_id}/cancel").status_code == 401
        assert anonymous.post("/api/tasks", json={}).status_code == 401
        wrong = {"Authorization": "Bearer not-the-token"}
        assert anonymous.get("/api/overview", headers=wrong).status_code == 401
        assert anonymous.post("/login", data={"token": "guess"}).status_code == 401
        assert anonymous.get("/healthz").status_code == 200
    assert db.run(conn, core.task_states([task_id]))[task_id].status == "pending"


def test_cross_site_posts_are_refused(browser: httpx.Client, console: Console, conn: Conn) -> None:
    load(conn, envelopes("alice", 2))
    ids = [row[0] for row in conn.execute("SELECT id FROM rota.tasks ORDER BY seq")]
    csrf = csrf_of(browser, f"/tasks/{ids[0]}")
    # The session cookie alone (what a page elsewhere could make a browser send).
    assert browser.post(f"/actions/tasks/{ids[0]}/cancel", data={"back": "/"}).status_code == 403
    assert browser.post(f"/api/tasks/{ids[0]}/cancel").status_code == 403
    # A right token from another origin.
    evil = {"Origin": "http://evil.example"}
    refused = browser.post(f"/actions/tasks/{ids[0]}/cancel", data={"csrf": csrf}, headers=evil)
    assert refused.status_code == 403
    assert db.run(conn, core.task_states(ids))[ids[0]].status == "pending"
    # The console's own form.
    own = {"Origin": console.url}
    done = browser.post(
        f"/actions/tasks/{ids[0]}/cancel", data={"csrf": csrf, "back": "/"}, headers=own
    )
    assert done.status_code == 303
    assert db.run(conn, core.task_states(ids))[ids[0]].status == "cancelled"
    api = browser.post(f"/api/tasks/{ids[1]}/cancel", headers={"X-CSRF-Token": csrf})
    assert api.status_code == 200


def test_without_a_token_the_console_reads_but_never_acts(settings: Settings, conn: Conn) -> None:
    load(conn, envelopes("alice", 1))
    (task_id,) = conn.execute("SELECT id FROM rota.tasks").fetchone()  # type: ignore[misc]
    with Console(settings) as running, httpx.Client(base_url=running.url) as client:
        assert client.get("/api/overview").status_code == 200
        refused = client.post(f"/api/tasks/{task_id}/cancel")
        assert refused.status_code == 403 and "ROTA_DASHBOARD_TOKEN" in refused.json()["error"]
        assert 'name="csrf"' not in client.get(f"/tasks/{task_id}").text  # no action buttons


def test_metrics_and_health(http: httpx.Client, conn: Conn) -> None:
    load(conn, envelopes("alice", 3, queue="pdfs"))
    db.run(conn, core.refresh_stats())
    text = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    assert samples[("rota_queue_tasks", (("queue", "pdfs"), ("state", "waiting")))] == 3
    assert samples[("rota_tenant_tasks", (("state", "waiting"), ("tenant", "alice")))] == 3
    assert samples[("rota_server_up", (("server", "redis"),))] == 1
    assert http.get("/readyz").status_code == 200


def test_the_console_says_when_redis_is_down(settings: Settings, conn: Conn) -> None:
    broken = settings.model_copy(
        update={"redis_url": "redis://127.0.0.1:1/0", "dashboard_token": TOKEN}
    )
    load(conn, envelopes("alice", 1))
    with (
        Console(broken) as running,
        httpx.Client(base_url=running.url, headers={"Authorization": f"Bearer {TOKEN}"}) as client,
    ):
        overview = client.get("/api/overview").json()
        assert "redis" in overview["unavailable"] and overview["queues"]
        assert client.get("/").status_code == 200
        assert client.get("/dead-letters").status_code == 503


WALL, OPS = "wall-screen-token-0123", "operator-token-0123456"


@pytest.fixture
def scoped(settings: Settings, tmp_path: Any) -> Iterator[Console]:
    """A console with two tokens from a tokens file: a wall screen's that may
    read and be scraped, an operator's that may do everything."""
    from rota.dashboard.auth import token_hash

    tokens = tmp_path / "tokens"
    tokens.write_text(
        f"wall read,metrics {token_hash(WALL)}\nops read,act,enqueue,metrics {token_hash(OPS)}\n"
    )
    with Console(settings.model_copy(update={"console_tokens_file": tokens})) as running:
        yield running


def test_each_token_does_what_its_scopes_allow_and_is_the_audit_actor(
    scoped: Console, conn: Conn
) -> None:
    load(conn, envelopes("alice", 2))
    ids = [row[0] for row in conn.execute("SELECT id FROM rota.tasks ORDER BY seq")]
    wall = httpx.Client(base_url=scoped.url, headers={"Authorization": f"Bearer {WALL}"})
    ops_ = httpx.Client(base_url=scoped.url, headers={"Authorization": f"Bearer {OPS}"})
    with wall, ops_:
        assert wall.get("/api/overview").status_code == 200
        assert wall.get("/metrics").status_code == 200
        refused = wall.post(f"/api/tasks/{ids[0]}/cancel")
        assert refused.status_code == 403 and "'wall' may not act" in refused.json()["error"]
        assert wall.post("/api/tasks", json={"name": "x.y"}).status_code == 403
        assert wall.post("/api/queues/default/pause").status_code == 403
        assert 'name="csrf"' not in wall.get(f"/tasks/{ids[0]}").text  # no action buttons
        assert db.run(conn, core.task_states(ids))[ids[0]].status == "pending"
        assert ops_.post(f"/api/tasks/{ids[0]}/cancel").status_code == 200
    actors = {row[0] for row in conn.execute("SELECT actor FROM rota.audit")}
    assert actors == {"console:ops"}


def test_a_foreign_host_name_is_refused(console: Console) -> None:
    # What a DNS-rebinding page would send: the console's address, another name.
    with httpx.Client(base_url=console.url) as client:
        assert client.get("/healthz", headers={"Host": "evil.example"}).status_code == 400
        assert client.get("/healthz", headers={"Host": "localhost"}).status_code == 200


def test_pages_carry_security_headers_and_run_only_their_own_script(http: httpx.Client) -> None:
    page = http.get("/")
    policy = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'self'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    nonce = re.search(r"script-src 'nonce-([^']+)'", policy)
    assert nonce and f'<script nonce="{nonce.group(1)}">' in page.text
    assert http.get("/").headers["content-security-policy"] != policy  # a nonce per response


def test_logins_are_throttled(settings: Settings) -> None:
    console = Console(settings.model_copy(update={"dashboard_token": TOKEN}))
    with console as running, httpx.Client(base_url=running.url, follow_redirects=False) as client:
        for _ in range(5):
            assert client.post("/login", data={"token": "guess"}).status_code == 401
        throttled = client.post("/login", data={"token": TOKEN})  # even the right one
        assert throttled.status_code == 429 and "too many failed logins" in throttled.text


def test_logout_is_a_post_with_the_session_s_csrf(browser: httpx.Client) -> None:
    csrf = csrf_of(browser, "/")
    assert browser.post("/logout", data={"csrf": "forged"}).status_code == 403
    assert browser.get("/api/overview").status_code == 200  # still logged in
    out = browser.post("/logout", data={"csrf": csrf})
    assert out.status_code == 303 and 'rota_session=""' in out.headers["set-cookie"]


def test_a_read_that_runs_too_long_is_cut_off(settings: Settings, conn: Conn) -> None:
    quick = settings.model_copy(
        update={"dashboard_token": TOKEN, "console_statement_timeout_seconds": 0.5}
    )
    with (
        Console(quick) as running,
        httpx.Client(base_url=running.url, headers={"Authorization": f"Bearer {TOKEN}"}) as client,
        psycopg.connect(settings.database_url) as locker,
    ):
        # Another session holds what the tenants page reads.
        locker.execute("LOCK TABLE rota.tenants IN ACCESS EXCLUSIVE MODE")
        answer = client.get("/api/tenants")
        assert answer.status_code == 503
        assert "ROTA_CONSOLE_STATEMENT_TIMEOUT_SECONDS (0.5 s)" in answer.json()["error"]
        locker.rollback()
        assert client.get("/api/tenants").status_code == 200


def test_a_body_past_the_limit_is_refused_unread(http: httpx.Client, conn: Conn) -> None:
    before = conn.execute("SELECT count(*) FROM rota.tasks").fetchone()
    huge = b'{"name": "x.y", "args": ["' + b"a" * (5 * 1024 * 1024) + b'"]}'
    answer = http.post("/api/tasks", content=huge, headers={"Content-Type": "application/json"})
    assert answer.status_code == 413  # starlette>=1.6's max_body_size, which rota relies on
    assert conn.execute("SELECT count(*) FROM rota.tasks").fetchone() == before


def test_a_pages_handlers_run_alone(settings: Settings, conn: Conn) -> None:
    """No app, no HTTP: a handler is a function of a request and the servers."""
    from starlette.requests import Request

    from rota.dashboard.data import Connections
    from rota.dashboard.pages import overview, tenant

    def request(**path_params: str) -> Request:
        return Request(
            {
                "type": "http",
                "method": "GET",
                "path": "/",
                "headers": [],
                "query_string": b"",
                "path_params": path_params,
            }
        )

    load(conn, envelopes("alice", 2, queue="pdfs"))
    db.run(conn, core.refresh_stats())
    conns = Connections(settings)
    try:
        found = tenant.tenant(request(name="alice"), conns)
        assert found is not None and found["tenant"]["queues"][0]["waiting"] == 2
        assert tenant.tenant(request(name="nobody"), conns) is None
        paused = tenant.pause(request(name="alice"), {}, conns, "console:test")
        assert paused == {"found": True, "tenant": "alice", "paused": True}
        figures = overview.overview(request(), conns)
        assert figures["unavailable"] == {} and figures["queues"][0]["waiting"] == 2
    finally:
        conns.close()


def test_a_task_shows_its_place_in_a_workflow(
    http: httpx.Client, conn: Conn, settings: Settings
) -> None:
    import rota
    from rota.cli.tasks import render_story
    from rota.readmodel.story import task_story

    with rota.App(settings) as app:

        @app.task(queue="flows")
        def step(n: int) -> int:
            return n

        @app.task(queue="flows")
        def gather(results: list[int]) -> None: ...

        stored = app.enqueue_workflow(
            rota.group(
                step.using(tenant="acme").prepare(1), step.using(tenant="acme").prepare(2)
            ).then(gather.using(tenant="acme").receiving())
        )
    first, second, join = stored.ids
    story = task_story(conn, None, settings, join)
    assert story.why.startswith("a join of a workflow: waits for 2 of its 2 member(s)")
    text = render_story(story)
    assert f"join of 2 member(s), 2 yet to succeed:\n  member {first}\n  member {second}" in text
    member = render_story(task_story(conn, None, settings, first))
    assert f"member of join {join} (2 of its 2 member(s) yet to succeed)" in member
    assert http.get(f"/api/tasks/{join}").json()["task"]["graph"]["member_ids"] == [
        str(first),
        str(second),
    ]
    page = http.get(f"/tasks/{join}").text
    assert "join of 2 member(s), 2 yet to succeed" in page and f'href="/tasks/{first}"' in page
    assert f'member of join <a href="/tasks/{join}">' in http.get(f"/tasks/{second}").text
