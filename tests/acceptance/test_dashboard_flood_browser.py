"""The console under a live flood, read in a real browser (headless
Chromium, Selenium): a loader, one worker (concurrency 4) and the dashboard
run as processes while tenant acme floods the queue with 50 ms tasks and
three small tenants send 2 tasks a second each; maintenance keeps the
history. Each figure an operator was misled by is read from the rendered
page: a small tenant's fair share is its demand, the tenants list shows the
small tenants at their fair share and acme, while a minute ended with its
backlog, below its demand at its fair share (as acme's own page), the backlog and oldest
wait charts keep the minute's peak that /api/overview showed, service per
tenant names acme once its backlog cleared, a succeeded task's page shows
its attempts allowed and cost and that its 50 ms run ran 0.05 s, running
stays within the worker's concurrency (on the overview, the tenants list
and the running tasks' list) apart from what is claimed but not started,
waits under a second read in ms, empty tables say "none", and time labels
fall at round steps."""

from __future__ import annotations

import itertools
import re
import sys
import threading
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from rota import App
from rota.dashboard import charts
from tests.acceptance.test_dashboard_browser import (  # noqa: F401
    ROOT,
    SHOTS,
    TOKEN,
    browser,
    dashboard,
    log_in,
    rows_of,
    text_of,
)
from tests.acceptance.test_workers import start_worker, stop
from tests.helpers import start_logged, wait_for

pytestmark = pytest.mark.slow(
    reason="a flood of thousands of tasks through a loader and a worker, and whole minutes "
    "of history for the charts to read"
)

FLOOD = 3_000  # 37.5 s of work at least: begun past 25 s, it outlasts its minute
SMALL = ("globex", "initech", "starved-co")
CONCURRENCY = 4
PLOT_BOTTOM = charts.HEIGHT - charts.BOTTOM
PLOT_HEIGHT = PLOT_BOTTOM - charts.TOP
SUFFIXES = {"k": 1e3, "M": 1e6, "G": 1e9, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def label_value(label: str) -> float:
    """A tick label's value (charts.number written backwards)."""
    found = re.fullmatch(r"([0-9.]+)(ms|s|m|h|d|k|M|G)?", label)
    assert found, label
    scale = 86_400.0 if found[2] == "d" else SUFFIXES.get(found[2] or "", 1.0)
    return float(found[1]) * scale


def chart_values(driver: WebDriver, chart: str) -> dict[str, list[tuple[float, float]]]:
    """Each series of a chart as the page drew it: (x, value) per point,
    the value read back from the pixel height against the top tick's label
    (read in one script, so that no refresh falls between its steps)."""
    script = """
        var svg = document.querySelector(arguments[0]);
        if (!svg) return null;
        var ticks = Array.from(svg.querySelectorAll('.gridlines text'), t => t.textContent);
        var paths = Array.from(svg.querySelectorAll('path[data-series]'),
                               p => [p.dataset.series, p.getAttribute('d')]);
        return [ticks, paths];
    """
    found = driver.execute_script(script, f"svg[data-chart='{chart}']")
    assert found, f"no {chart} chart on {driver.current_url}"
    ticks, paths = found
    top = label_value(ticks[-1])
    drawn: dict[str, list[tuple[float, float]]] = {}
    for name, d in paths:
        points = re.findall(r"[ML]([0-9.]+),([0-9.]+)", d or "")
        drawn[name] = [(float(x), top * (PLOT_BOTTOM - float(y)) / PLOT_HEIGHT) for x, y in points]
    drawn["_pixel"] = [(0.0, top / PLOT_HEIGHT)]  # what 1 px is worth
    return drawn


def legend(driver: WebDriver, chart: str) -> dict[str, str]:
    items = rows_of(driver, f"#chart-{chart} .legend li")
    return dict(item.rsplit(" ", 1) if " " in item else (item, "") for item in items)


def time_labels(driver: WebDriver, chart: str) -> list[str]:
    script = "return Array.from(document.querySelectorAll(arguments[0]), t => t.textContent)"
    return [str(t) for t in driver.execute_script(script, f"svg[data-chart='{chart}'] .axis text")]


FAIR_WORDING = re.compile(
    r"served ([0-9.,]+) of fair share ([0-9.,]+), demand ([0-9.,]+) \((\w+) its fair share\)"
)
Fair = tuple[float, float, float, str]  # served, fair share, demand per minute; standing


def worded(text: str) -> Fair:
    found = FAIR_WORDING.search(text)
    assert found, text
    served, fair, demand, standing = found.groups()
    return (
        float(served.replace(",", "")),
        float(fair.replace(",", "")),
        float(demand.replace(",", "")),
        standing,
    )


def tenants_list(driver: WebDriver, url: str) -> dict[str, Fair]:
    """Each tenant's served, fair share and demand as the tenants list words
    them (its standing also in the cell's data-standing)."""
    driver.get(url + "/tenants?sort=name&order=asc")
    script = """
        return Array.from(document.querySelectorAll('#tenants td.fair'), c =>
            [c.parentElement.querySelector('a').innerText, c.dataset.standing, c.innerText]);
    """
    found = {}
    for name, standing, text in driver.execute_script(script):
        found[str(name)] = worded(str(text))
        assert found[str(name)][3] == standing, (name, standing, text)
    return found


def table_after(driver: WebDriver, heading: str) -> list[list[str]]:
    """The cells of the rows of the table under a heading (read in one script)."""
    script = """
        var h = Array.from(document.querySelectorAll('h2')).find(e => e.innerText == arguments[0]);
        var t = h && h.nextElementSibling;
        return t ? Array.from(t.rows, r => Array.from(r.cells, c => c.innerText)) : [];
    """
    return [[str(c) for c in row] for row in driver.execute_script(script, heading)]


class Flood:
    """What /api/overview and the overview page showed while the flood
    ran: the peaks, and each reading of running against claimed; and what
    the tenants list and the running tasks' list showed running."""

    def __init__(self, url: str, driver: WebDriver) -> None:
        self.api = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        )
        self.driver = driver
        self.waiting = 0
        self.oldest = 0.0
        # The cards' running and prefetched, and the work queue's row's.
        self.readings: list[tuple[int, int, int, int]] = []
        self.listed: list[tuple[int, int]] = []  # acme running on /tenants, rows running

    def look(self) -> bool:
        """One reading of both; whether the flood is over (nothing of acme's
        waiting or claimed, after some was)."""
        overview = self.api.get("/api/overview").json()
        (work,) = [q for q in overview["queues"] if q["name"] == "work"] or [None]
        if work is not None:
            self.waiting = max(self.waiting, work["waiting"])
            self.oldest = max(self.oldest, work["oldest_wait_seconds"] or 0.0)
        # The overview's cards and queue table from one render.
        script = """
            var get = id => (document.getElementById(id) || {}).innerText || '';
            var row = Array.from(document.querySelectorAll('#queues tr'))
                           .find(r => r.cells[0] && r.cells[0].innerText.trim() == 'work');
            return [get('total-running'), get('total-prefetched'),
                    row ? row.cells[2].innerText : '', row ? row.cells[3].innerText : ''];
        """
        shown = self.driver.execute_script(script)
        if all(shown):
            running, prefetched, row_running, row_prefetched = (
                int(n.replace(",", "")) for n in shown
            )
            self.readings.append((running, prefetched, row_running, row_prefetched))
        # The tenants list's running column for acme, and the running tasks' rows.
        tenants = self.api.get("/tenants").text
        found = re.search(
            r'href="/tenants/acme">acme</a>.*?</td>\s*<td class="num">[^<]*</td>'
            r'<td class="num">[^<]*</td>\s*<td class="num">([0-9,]+)</td>',
            tenants,
            re.S,
        )
        listed = self.api.get("/tasks", params={"state": "running", "limit": 200}).text
        rows = len(re.findall(r'<a href="/tasks/[0-9a-f-]{36}">', listed))
        if found:
            self.listed.append((int(found[1].replace(",", "")), rows))
        acme = [t for t in overview["tenants"] if t["name"] == "acme"]
        busy = bool(acme) and acme[0]["waiting"] + acme[0]["running"] + acme[0]["prefetched"] > 0
        return self.waiting >= FLOOD // 4 and not busy


def most_at_once(conn: psycopg.Connection[Any]) -> int:
    """The most tasks that ran at one moment, from their own log."""
    runs = conn.execute("SELECT started, ended FROM test_log").fetchall()
    edges = sorted([(s, 1) for s, _ in runs] + [(e, -1) for _, e in runs])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def minutes_of(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """The history the fair shares are read from, minute by minute: each
    tenant's completions, demand and fair share, and its queue's level."""
    return conn.execute(
        "SELECT to_char(m.minute, 'HH24:MI'), t.name, m.completed, m.demand,"
        " round(m.fair_share::numeric, 1), h.fair_level"
        " FROM rota.tenant_minutes(ARRAY(SELECT id FROM rota.tenants),"
        "      date_trunc('minute', now()) - interval '10 minutes', now()) m"
        " JOIN rota.tenants t ON t.id = m.tenant_id"
        " LEFT JOIN rota.queue_history h ON h.minute = m.minute AND h.queue_id = m.queue_id"
        " WHERE m.completed > 0 OR m.demand > 0 ORDER BY 1, 2"
    ).fetchall()


def test_the_console_tells_the_truth_under_a_flood(
    env: dict[str, str],
    producer: App,
    conn: psycopg.Connection[Any],
    dashboard: str,  # noqa: F811
    browser: WebDriver,  # noqa: F811
) -> None:
    # Maintenance counts every second (the dashboard's fixture reads it
    # every half second); one worker of 4, one loader.
    env = {**env, "ROTA_STATS_SECONDS": "1", "ROTA_SHARDS": str(producer.settings.shards)}
    loader = start_logged(
        [sys.executable, "-m", "rota", "loader", "run", "--engine", "python"], env=env, cwd=ROOT
    )
    worker = start_worker(env, "--concurrency", str(CONCURRENCY))
    sleep = producer.tasks["sleep"]
    stop_trickle = threading.Event()

    def trickle() -> None:
        while not stop_trickle.wait(0.5):  # 2 tasks a second each
            producer.enqueue_many([sleep.using(tenant=name).prepare(0.05) for name in SMALL])

    trickler = threading.Thread(target=trickle)
    flood = Flood(dashboard, browser)
    try:
        browser.get(dashboard + "/login")
        log_in(browser)
        (costly,) = producer.enqueue_many([sleep.using(tenant="initech", cost=3).prepare(0.05)])
        # The trickle and the flood begin in the first half of a minute, so
        # that acme's backlog fills the minute they begin in: the queue then
        # serves more than the small tenants ask, and each is owed what it
        # asked for. (Begun in its last seconds, the minute's few completions
        # are what max-min shares out, below the small tenants' demand.)
        # Begun past 25 s, the flood (at least 37.5 s of work for 4 slots)
        # outlasts its minute: a minute ends with acme's backlog, and the
        # tenants list, over the last whole minutes, shows it asking for
        # more than it got.
        wait_for(lambda: 25 <= datetime.now(UTC).second < 30, timeout=70, what="second 25")
        trickler.start()
        started = datetime.now(UTC).replace(second=0, microsecond=0)
        for first in range(0, FLOOD, 500):
            producer.enqueue_many(
                [sleep.using(tenant="acme").prepare(0.05) for _ in range(first, first + 500)]
            )
        listings: list[dict[str, Fair]] = []

        def watch() -> bool:
            """The overview's reading, then the tenants list's, during the flood."""
            over = flood.look()
            listings.append(tenants_list(browser, dashboard))
            browser.get(dashboard + "/")
            return over

        browser.get(dashboard + "/")
        wait_for(watch, timeout=200, what="acme's flood to be served")
        # The trickle ends with the flood: in a minute after it, a small
        # tenant's task enqueued in its last moment would be demand the
        # queue had no time to serve.
        stop_trickle.set()
        trickler.join()
        browser.save_screenshot(str(SHOTS / "flood-overview.png"))

        # Running never above the worker's concurrency; what it holds
        # beyond is shown apart, on the cards as in the queue's row (the
        # worker's only queue), on the tenants list and the running list.
        assert flood.readings, "no overview read during the flood"
        assert all(r <= CONCURRENCY and (r, p) == (qr, qp) for r, p, qr, qp in flood.readings), (
            flood.readings
        )
        assert any(p > 0 for _, p, _, _ in flood.readings), flood.readings  # it prefetched
        assert flood.listed, "no tenants list read during the flood"
        assert all(r <= CONCURRENCY and n <= CONCURRENCY for r, n in flood.listed), flood.listed
        assert most_at_once(conn) <= CONCURRENCY
        print(
            "overview readings (running, claimed not started; the queue's):",
            sorted(set(flood.readings)),
            "tenants list's acme running, running list's rows:",
            sorted(set(flood.listed)),
        )

        # The tenants list while the flood ran: the small tenants always at
        # their fair share (served as fast as they sent); acme always at its
        # fair share, and below its demand once a minute had ended with its
        # backlog: what the queue had left after the small tenants.
        assert listings, "no tenants list read during the flood"
        for listing in listings:
            for name in SMALL:
                assert listing.get(name, (0, 0, 0, "at"))[3] == "at", (name, listing)
            if "acme" in listing:
                served_pm, fair_pm, _, standing = listing["acme"]
                assert standing == "at" and fair_pm == served_pm, (listing, minutes_of(conn))
        below = [
            one["acme"] for one in listings if "acme" in one and one["acme"][2] > one["acme"][0]
        ]
        assert below, listings
        print("acme on the tenants list below its demand:", below[-1], "of", len(listings))
        browser.save_screenshot(str(SHOTS / "flood-tenants.png"))

        # The list and acme's own page say the same, in the same words (both
        # read in one minute: the window moves at a minute's end).
        def alike() -> tuple[Fair, Fair] | None:
            minute = datetime.now(UTC).replace(second=0, microsecond=0)
            listed = tenants_list(browser, dashboard).get("acme")
            browser.get(dashboard + "/tenants/acme")
            card = worded(text_of(browser, "#fair-share"))
            if datetime.now(UTC).replace(second=0, microsecond=0) != minute:
                return None
            return (card, listed) if listed is not None else None

        card, listed = wait_for(alike, timeout=20, what="the list and the page in one minute")
        assert card == listed and card[3] == "at", (card, listed)

        # A whole minute of the flood in the history: the small tenants'
        # demand and fair share are counted for it.
        page = f"{dashboard}/tenants/starved-co?window=15m"

        def whole_minute() -> dict[str, list[tuple[float, float]]] | None:
            if datetime.now(UTC).replace(second=0, microsecond=0) <= started:
                return None
            browser.get(page)
            drawn = chart_values(browser, "service")
            return drawn if any(v > 0 for _, v in drawn["fair share"]) else None

        drawn = wait_for(whole_minute, timeout=90, what="a whole minute of the flood")

        # The fair share line lies on the demand line (dashed apart, since
        # they coincide), and close above what was served: never the
        # weight's part of the flood's completions.
        pixel = drawn["_pixel"][0][1]
        demand = dict(drawn["demand"])
        served = dict(drawn["completed"])
        owed = [(x, v) for x, v in drawn["fair share"] if v > 0]
        assert owed
        for x, value in owed:
            assert abs(value - demand.get(x, -1)) <= pixel, (x, value, drawn)
            done = served.get(x, -1)
            assert done <= value + pixel and value <= done * 1.2 + 5, (value, done)
        assert "data-dash" in browser.execute_script(
            "return document.querySelector(arguments[0]).outerHTML",
            "#chart-service li[data-series='fair share']",
        )
        # The card over the last whole minutes: at its fair share, what it
        # asked for but for its tasks in flight at the window's end.
        served_pm, fair_pm, demand_pm, standing = worded(text_of(browser, "#fair-share"))
        assert standing == "at" and fair_pm == served_pm <= demand_pm, (fair_pm, demand_pm)
        # Its waits are tens of ms: read in ms, never rounded to "0.0 s".
        waits = [row[2] for row in table_after(browser, "Service, last hour")[1:]]
        assert any(re.fullmatch(r"[0-9]+ ms", w) for w in waits), waits
        assert "0.0 s" not in waits
        browser.save_screenshot(str(SHOTS / "flood-tenant.png"))
        print("starved-co fair share per minute:", owed, "served:", served, "waits:", waits)

        # Everything served: the legends say nothing waits now.
        def emptied() -> bool:
            browser.get(dashboard + "/?window=15m")
            shown = (legend(browser, "backlog"), legend(browser, "oldest_wait"))
            # No tenant of the run waits or is claimed (the worker's cron
            # ticks, in a queue it does not serve, may wait).
            rows = rows_of(browser, "#top-tenants tr")[1:]
            busy = {"acme", *SMALL} & {row.split("\t")[0] for row in rows}
            return not busy and all(one.get("work") == "none" for one in shown)

        wait_for(emptied, what="the queue to empty")
        # Everything served: every tenant of the run at its fair share.
        after = tenants_list(browser, dashboard)
        assert {name: after[name][3] for name in ("acme", *SMALL)} == dict.fromkeys(
            ("acme", *SMALL), "at"
        ), after
        browser.get(dashboard + "/?window=15m")
        # The overview's charts keep the flood's peaks.
        backlog = chart_values(browser, "backlog")
        pixel = backlog["_pixel"][0][1]
        assert max(v for _, v in backlog["work"]) >= flood.waiting - pixel, (
            backlog["work"],
            flood.waiting,
        )
        oldest = chart_values(browser, "oldest_wait")
        pixel = oldest["_pixel"][0][1]
        # /api/overview reads the wait at its own time, up to a count
        # (ROTA_STATS_SECONDS) and the console's cache after maintenance.
        assert max(v for _, v in oldest["work"]) >= flood.oldest - 1.5 - pixel, (
            oldest["work"],
            flood.oldest,
        )
        # Time labels at round steps: 5 minutes in a 15-minute window.
        labels = time_labels(browser, "backlog")
        minutes = [int(t[:2]) * 60 + int(t[3:]) for t in labels]
        assert labels and all(m % 5 == 0 for m in minutes), labels
        assert all((b - a) % 1440 == 5 for a, b in itertools.pairwise(minutes)), labels
        browser.save_screenshot(str(SHOTS / "flood-overview-after.png"))

        # Service per tenant: acme by what it was served, its backlog gone.
        browser.get(dashboard + "/charts?window=15m")
        service = chart_values(browser, "service")
        assert max(v for _, v in service["acme"]) > 0, service
        assert {"acme", *SMALL} <= set(service) - {"_pixel"}

        # Empty tables say so: acme's page, all served, nothing dead.
        browser.get(dashboard + "/tenants/acme?window=15m")
        assert table_after(browser, "Per queue")[1:] == [
            ["none: nothing waiting, claimed, scheduled or dead at the last count"]
        ]
        assert table_after(browser, "Recent dead tasks")[1:] == [["none"]]

        # A succeeded task's page: the attempts allowed and cost it had.
        browser.get(f"{dashboard}/tasks/{costly}")
        assert text_of(browser, "#where") == "succeeded"
        assert text_of(browser, "#attempts") == "1 of 5"
        assert text_of(browser, "#cost") == "3"
        # Its 50 ms run, as its worker measured it: never its claim's wait.
        ran = text_of(browser, "#ran")
        assert re.fullmatch(r"0\.0[4-9][0-9]? s|0\.[1-4][0-9]? s", ran), ran
        assert f"ran {ran}" in text_of(browser, "#why")
        browser.save_screenshot(str(SHOTS / "flood-task.png"))
    finally:
        stop_trickle.set()
        if trickler.is_alive():
            trickler.join()
        flood.api.close()
        stop(worker)
        stop(loader)
