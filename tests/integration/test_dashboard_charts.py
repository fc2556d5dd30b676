"""The console's charts over real servers: the history maintenance keeps
(rota.queue_history, with rota.refresh_stats), the read model's history
reads, and the pages and API that draw and send the series."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg

from rota import core
from rota.core import db, history
from tests.helpers import claim, envelopes, load
from tests.integration.test_dashboard import browser, console, http  # noqa: F401 (fixtures)

Conn = psycopg.Connection[Any]


def _minute(ago: int = 0) -> datetime:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    return now - timedelta(minutes=ago)


def _history(conn: Conn) -> list[tuple[Any, ...]]:
    """Per queue: the latest minute's counts, and the completions and deaths
    of every minute (a test may cross a minute's end)."""
    return conn.execute(
        "SELECT q.name, (array_agg(h.waiting ORDER BY h.minute DESC))[1],"
        " (array_agg(h.running ORDER BY h.minute DESC))[1],"
        " bool_and(h.oldest_wait_seconds IS NOT NULL), sum(h.completed)::int, sum(h.died)::int"
        " FROM rota.queue_history h JOIN rota.queues q ON q.id = h.queue_id"
        " GROUP BY q.name ORDER BY q.name"
    ).fetchall()


def _seed(conn: Conn, minutes: int = 30) -> None:
    """A past half hour: queue pdfs backs up while tenant big is served with
    500 more waiting, and small is served the 2 a minute it asks for (the
    minute's fair level, 48: small is owed its 2, big the other 48)."""
    load(conn, envelopes("big", 2, queue="pdfs") + envelopes("small", 2, queue="pdfs"))
    ids = dict(conn.execute("SELECT name, id FROM rota.tenants").fetchall())
    queue_id = conn.execute("SELECT id FROM rota.queues WHERE name = 'pdfs'").fetchone()[0]  # type: ignore[index]
    for ago in range(1, minutes + 1):
        minute = _minute(ago)
        conn.execute(
            "INSERT INTO rota.queue_history VALUES (%s, %s, %s, 2, %s, %s, %s, %s, 2, %s, 48)",
            (
                minute,
                queue_id,
                1000 - ago * 10,
                60.0 * (minutes - ago),
                50,
                ago % 3,
                2000 - ago * 10,  # the minute's peak, above its last count
                90.0 * (minutes - ago),
            ),
        )
        for tenant, done, pending in (("big", 48, 500), ("small", 2, 0)):
            conn.execute(
                "INSERT INTO rota.service VALUES (%s, %s, %s, %s, %s, %s)",
                (minute, queue_id, ids[tenant], done, done * 1.5, pending),
            )


def test_maintenance_keeps_each_queues_history_per_minute(conn: Conn) -> None:
    # Counted on a clock of the test's (half past a minute that is still to
    # come), with the tasks' end times set on it: no wait for the wall's.
    (clock,) = conn.execute("SELECT date_trunc('minute', now()) + interval '90 seconds'").fetchone()  # type: ignore[misc]
    load(conn, envelopes("alice", 5, queue="pdfs", max_attempts=1) + envelopes("bob", 2))
    got = claim(conn, 3, queues=("pdfs",))
    db.transact(conn, core.complete([got[0].token]))
    db.transact(conn, core.fail([core.Failure(got[1].id, 1, "ValueError: bad", final=True)]))
    ended = {"at": clock - timedelta(seconds=2)}
    conn.execute("UPDATE rota.finished SET finished_at = %(at)s", ended)
    conn.execute("UPDATE rota.tasks SET finished_at = %(at)s WHERE status = 'dead'", ended)
    db.run(conn, core.count_service(clock))
    db.run(conn, core.refresh_stats(clock))
    assert _history(conn) == [("default", 2, 0, True, 0, 0), ("pdfs", 2, 1, True, 1, 1)]
    # Counted again in the same minute: the last count stands, nothing doubles.
    db.transact(conn, core.complete([got[2].token]))
    conn.execute(
        "UPDATE rota.finished SET finished_at = %(at)s WHERE task_id = %(id)s",
        {"at": clock + timedelta(seconds=0.5), "id": got[2].id},
    )
    db.run(conn, core.count_service(clock + timedelta(seconds=1)))  # up to a second before
    db.run(conn, core.refresh_stats(clock + timedelta(seconds=1)))
    assert _history(conn)[1][4] == 1  # not yet counted: it ended less than a second ago
    db.run(conn, core.count_service(clock + timedelta(seconds=2)))
    db.run(conn, core.refresh_stats(clock + timedelta(seconds=2)))
    assert _history(conn) == [("default", 2, 0, True, 0, 0), ("pdfs", 2, 0, True, 2, 1)]
    # A day is kept.
    conn.execute(
        "INSERT INTO rota.queue_history (minute, queue_id, waiting, running)"
        " SELECT %(at)s - interval '25 hours', id, 1, 1 FROM rota.queues",
        {"at": clock},
    )
    db.run(conn, core.refresh_stats(clock))
    old = conn.execute(
        "SELECT count(*) FROM rota.queue_history WHERE minute < %(at)s - interval '1 day'",
        {"at": clock},
    ).fetchone()
    assert old == (0,)


def test_history_reads_bucket_the_window(conn: Conn) -> None:
    _seed(conn)
    since = _minute(29)
    points = db.run(conn, history.queue_history(since, 300))
    assert {p.queue for p in points} == {"pdfs"}
    assert sum(p.completed for p in points) == 29 * 50
    assert all(p.at.timestamp() % 300 == 0 for p in points)
    # Gauges: each bucket's peak, not its last count; the last kept beside it.
    assert max(p.waiting for p in points) == 2000 - 10
    newest = max(points, key=lambda p: p.at)
    assert newest.waiting_last == 1000 - 10 and newest.waiting == 2000 - 10
    assert newest.oldest_wait_seconds == 90.0 * 29 and newest.oldest_wait_last == 60.0 * 29
    tenants = db.run(conn, history.tenant_history(["small", "big", "nobody"], since, 60))
    small = [p for p in tenants if p.tenant == "small"]
    big = [p for p in tenants if p.tenant == "big"]
    # Every minute of the window: the 29 kept and the minute now, with no
    # record yet, which carries the last unfinished count forward.
    assert {p.tenant for p in tenants} == {"small", "big"} and len(small) == len(big) == 30
    small, (big_now,) = small[:-1], big[-1:]
    big = big[:-1]
    assert (big_now.completed, big_now.demand, big_now.fair_share) == (0, 500, None)
    assert all(p.completed == 2 and p.wait_seconds == 1.5 for p in small)
    # Served what it asked for: its fair share is its demand, not half of all.
    assert all(p.demand == 2 and p.fair_share == 2 for p in small)
    assert all(p.demand == 548 and p.fair_share == 48 for p in big)
    fair = db.run(conn, history.fair_shares(["small", "big", "nobody"]))
    assert set(fair) == {"small", "big"}
    assert (fair["small"].served_per_minute, fair["small"].demand_per_minute) == (2, 2)
    assert fair["small"].fair_share_per_minute == 2 and fair["small"].standing == "at"
    # Big's 500 waiting carried over five minutes are asked for once: 240
    # served and 500 unfinished, 148 a minute (not 548, a minute's demand).
    big_fair = fair["big"]
    assert (big_fair.served_per_minute, big_fair.demand_per_minute) == (48, 148)
    assert big_fair.fair_share_per_minute == 48 and big_fair.standing == "at"
    # Buckets of 5 minutes count a carried backlog once too.
    buckets = db.run(conn, history.tenant_history(["big"], _minute(15), 300))
    whole = [p for p in buckets if _minute(15) <= p.at <= _minute(5)]
    assert whole and all((p.completed, p.demand, p.fair_share) == (240, 740, 240) for p in whole)


def _series(chart: dict[str, Any]) -> list[str]:
    return [s["name"] for s in chart["series"]]


def test_the_api_sends_each_charts_series(http: httpx.Client, conn: Conn) -> None:  # noqa: F811
    _seed(conn)
    db.run(conn, core.refresh_stats())
    found = http.get("/api/charts", params={"window": "1h", "tenant": "small"}).json()
    charts = found["charts"]
    assert _series(charts["throughput"]) == ["completed", "died"]
    assert _series(charts["backlog"]) == ["pdfs"] == _series(charts["oldest_wait"])
    assert _series(charts["service"]) == ["small", "big", "other"]
    service = charts["service"]
    assert len(service["times"]) == 60 and service["step_seconds"] == 60
    small = service["series"][0]["values"]
    assert small[-2] == 2 and small[-1] is None  # whole minutes only
    assert charts["throughput"]["series"][0]["values"][-2] == 50
    overview = http.get("/api/overview", params={"window": "6h"}).json()
    assert overview["charts"]["backlog"]["step_seconds"] == 180
    tenant = http.get("/api/tenants/small").json()["charts"]
    assert _series(tenant["service"]) == ["completed", "demand", "fair share"]
    assert [s["values"][-2] for s in tenant["service"]["series"]] == [2, 2, 2]
    detail = http.get("/api/tenants/small").json()["tenant"]
    assert detail["fair_share_per_minute"] == detail["demand_per_minute"] == 2
    assert _series(tenant["wait"]) == ["mean wait"]
    assert http.get("/api/charts", params={"window": "1y"}).status_code == 400
    assert http.get("/api/charts", params={"tenant": "<script>"}).status_code == 400
    many = ",".join(f"t{i}" for i in range(6))
    assert http.get("/api/charts", params={"tenant": many}).status_code == 400
    assert httpx.get(str(http.base_url) + "/api/charts").status_code == 401


def test_pages_draw_the_charts(browser: httpx.Client, conn: Conn) -> None:  # noqa: F811
    _seed(conn)
    db.run(conn, core.refresh_stats())
    for path, charts in [
        ("/", ["throughput", "backlog", "oldest_wait"]),
        ("/charts?tenant=small", ["service", "throughput", "backlog", "oldest_wait"]),
        ("/tenants/small", ["service", "wait"]),
    ]:
        page = browser.get(path)
        assert page.status_code == 200, path
        assert re.findall(r'<svg [^>]*data-chart="(\w+)"', page.text) == charts, path
        assert 'style="' not in page.text  # the CSP forbids inline styles
    text = browser.get("/charts?tenant=small&window=15m").text
    assert re.findall(r'<path class="line [^"]*" data-series="([^"]+)"', text)[:3] == [
        "small",
        "big",
        "other",
    ]
    assert "no data in this window yet" not in text
