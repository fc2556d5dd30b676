"""The console's smaller truths over real servers: the tasks list's full
ids, total and pages; when a waiting task should start; every chart series
with a legend mark; an icon where browsers ask for one; a tenant's page
without its internal id; a succeeded task's loaded time "not kept"."""

from __future__ import annotations

import re
from typing import Any

import httpx
import psycopg
import pytest

from rota import Settings, core
from rota.core import db, taskpage
from tests.helpers import claim, envelopes, load
from tests.integration.test_cli_errors import rota
from tests.integration.test_cli_operations import env_of
from tests.integration.test_dashboard import (  # noqa: F401
    TOKEN,
    Console,
    console,
    http,
)

Conn = psycopg.Connection[Any]


def test_the_tasks_list_shows_whole_ids_the_total_and_pages(http: httpx.Client, conn: Conn) -> None:  # noqa: F811
    load(conn, envelopes("acme", 7))
    in_line = [
        str(i) for (i,) in conn.execute("SELECT task_id FROM rota.ready ORDER BY vtime, seq")
    ]
    pages = [
        http.get("/api/tasks", params={"state": "ready", "limit": 3, "page": n}).json()
        for n in (1, 2, 3)
    ]
    assert [(p["total"], p["pages"], p["more"]) for p in pages] == [(7, 3, False)] * 3
    listed = [t["id"] for p in pages for t in p["tasks"]]
    assert [len(p["tasks"]) for p in pages] == [3, 3, 1]
    assert sorted(listed) == sorted(in_line) and len(set(listed)) == 7

    page = http.get("/tasks", params={"state": "ready", "limit": 3, "page": 2}).text
    assert '<p id="total">7 tasks, 4\u20136 shown</p>' in page
    for task_id in listed[3:6]:  # the whole id, not a prefix the ids share
        assert f'<a href="/tasks/{task_id}"><code>{task_id}</code></a>' in page
    assert (
        'id="prev" href="/tasks?state=ready&amp;tenant=&amp;queue=&amp;page=1&amp;limit=3"' in page
    )
    assert (
        'id="next" href="/tasks?state=ready&amp;tenant=&amp;queue=&amp;page=3&amp;limit=3"' in page
    )
    assert "page 2 of 3" in page
    # Filtered, and past the pages counted.
    assert (
        http.get("/api/tasks", params={"state": "ready", "tenant": "nobody"}).json()["total"] == 0
    )
    deep = http.get("/api/tasks", params={"state": "ready", "limit": 1000, "page": 11})
    assert deep.status_code == 400 and "first 10,000 tasks" in deep.json()["error"]


def test_a_count_past_the_bound_says_over(
    http: httpx.Client,  # noqa: F811
    conn: Conn,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(taskpage, "TASKS_COUNTED", 4)
    load(conn, envelopes("acme", 6))
    found = http.get("/api/tasks", params={"state": "ready", "limit": 3}).json()
    assert (found["total"], found["more"], found["pages"], len(found["tasks"])) == (4, True, 2, 3)
    page = http.get("/tasks", params={"state": "ready", "limit": 3}).text
    assert "over 4 tasks: pages reach the first 4 (narrow by tenant or queue" in page


def test_why_a_task_waits_says_when_it_should_start(
    http: httpx.Client,  # noqa: F811
    conn: Conn,
    settings: Settings,
) -> None:
    db.run(conn, core.register_worker("w1", "h", 1, ["default"], 4))
    load(conn, envelopes("flood", 80) + envelopes("quiet", 1))
    quiet = conn.execute("SELECT id FROM rota.tasks WHERE tenant = 'quiet'").fetchone()[0]  # type: ignore[index]
    story = http.get(f"/api/tasks/{quiet}").json()
    assert story["task"]["ahead"] == 1
    assert story["start"]["seconds"] is None
    never = "no estimate of when it starts: completions were never counted"
    assert never in story["why"]
    conn.execute(
        "INSERT INTO rota.service_counted (up_to) VALUES (date_trunc('minute', now()))"
        " ON CONFLICT (only_row) DO UPDATE SET up_to = excluded.up_to"
    )
    idle = http.get(f"/api/tasks/{quiet}").json()["why"]
    assert idle.endswith(
        "no estimate of when it starts: nothing in queue default completed in the last 5 minutes"
    )

    # 600 completions over the last five whole minutes: 120 a minute.
    queue, tenant = conn.execute(
        "SELECT q.id, t.id FROM rota.queues q, rota.tenants t WHERE t.name = 'flood'"
    ).fetchone()  # type: ignore[misc]
    conn.execute(
        "INSERT INTO rota.service (minute, queue_id, tenant_id, completed, wait_seconds)"
        " SELECT date_trunc('minute', now()) - make_interval(mins => m), %s, %s, 120, 0"
        " FROM generate_series(1, 5) m",
        (queue, tenant),
    )
    story = http.get(f"/api/tasks/{quiet}").json()
    assert story["start"] == {
        "tasks_ahead": 1,
        "per_minute": 120.0,
        "minutes": 5,
        "seconds": 0.5,
        "why_not": None,
    }
    assert "estimated start: in under a second (1 tasks ahead, at its queue's " in story["why"]
    # `rota task show` tells the same story.
    shown = rota("task", "show", str(quiet), **env_of(settings))
    assert shown.returncode == 0 and "estimated start: in under a second" in shown.stdout
    last = conn.execute(
        "SELECT id FROM rota.tasks WHERE tenant = 'flood' ORDER BY id DESC LIMIT 1"
    ).fetchone()[0]  # type: ignore[index]
    page = http.get(f"/tasks/{last}").text
    assert re.search(
        r"estimated start: in about \d+ s \(\d+ tasks ahead, at its queue&#39;s "
        r"last-5-minutes rate of 120/min\)",
        page,
    ), page


def test_every_legend_series_has_a_mark(http: httpx.Client, conn: Conn) -> None:  # noqa: F811
    load(conn, envelopes("acme", 3))
    db.transact(conn, core.complete([t.token for t in claim(conn, 2)]))
    db.run(conn, core.count_service())
    db.run(conn, core.refresh_stats())
    for path in ("/tenants/acme", "/charts", "/"):
        page = http.get(path).text
        items = re.findall(r'<li data-series="([^"]+)"[^>]*>(.*?)</li>', page)
        assert items, path
        for name, item in items:
            mark = re.match(r'<svg class="swatch" [^>]*><line class="(s\d|other)( dash)?"', item)
            assert mark, (path, name, item)
    tenant = http.get("/tenants/acme").text
    assert re.search(
        r'<li data-series="fair share"><svg class="swatch"[^>]*><line class="s\d dash"', tenant
    )


def test_the_console_serves_an_icon_and_no_internal_id(
    console: Console,  # noqa: F811
    http: httpx.Client,  # noqa: F811
    conn: Conn,
) -> None:
    with httpx.Client(base_url=console.url) as anyone:  # no token: browsers ask for it unasked
        for path in ("/favicon.ico", "/favicon.svg"):
            icon = anyone.get(path)
            assert icon.status_code == 200, path
            assert icon.headers["content-type"].startswith("image/svg+xml")
            assert icon.text.startswith("<svg")
    load(conn, envelopes("acme", 1))
    db.run(conn, core.refresh_stats())
    page = http.get("/tenants/acme").text
    assert '<link rel="icon" href="/favicon.svg" type="image/svg+xml">' in page
    assert "slot" not in page


def test_a_succeeded_tasks_page_says_not_kept_for_what_its_record_lacks(
    http: httpx.Client,  # noqa: F811
    conn: Conn,
) -> None:
    load(conn, envelopes("acme", 1))
    (task,) = claim(conn, 1)
    db.transact(conn, core.complete([task.token]))
    page = http.get(f"/tasks/{task.id}").text
    assert '<td id="loaded">not kept</td>' in page and '<td id="eta">not kept</td>' in page
    load(conn, envelopes("acme", 1))
    ready = conn.execute("SELECT task_id FROM rota.ready").fetchone()[0]  # type: ignore[index]
    page = http.get(f"/tasks/{ready}").text
    assert re.search(r'<td id="loaded">\d{4}-\d\d-\d\dT', page) and '<td id="eta">-</td>' in page
