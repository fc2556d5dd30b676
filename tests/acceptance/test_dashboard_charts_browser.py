"""The console's charts in a real browser (headless Chromium, Selenium, the
fixtures of test_dashboard_browser): after an hour in which one tenant was
starved, the overview, the charts page and the tenant's page draw their
charts with the right series, in light and dark schemes. The charts page's
screenshot is the README's (docs/console-charts.png)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from rota import core
from rota.core import db
from tests.acceptance.test_dashboard_browser import (  # noqa: F401
    ROOT,
    SHOTS,
    browser,
    dashboard,
    log_in,
    type_into,
)
from tests.helpers import envelopes, load, wait_for

QUEUES = ("reports", "emails")
TENANTS = ("acme", "globex", "initech", "starved-co")


def seed_an_hour(conn: psycopg.Connection[Any]) -> None:
    """An hour of history: reports backs up from 35 minutes ago, when
    starved-co stops being served while acme takes the workers."""
    batch = [e for t in TENANTS for q in QUEUES for e in envelopes(t, 40, queue=q)]
    load(conn, batch + envelopes("starved-co", 300, queue="reports"))
    ids = dict(conn.execute("SELECT name, id FROM rota.tenants").fetchall())
    queues = dict(conn.execute("SELECT name, id FROM rota.queues").fetchall())
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    for ago in range(1, 61):
        minute, late = now - timedelta(minutes=ago), ago <= 35
        for queue in QUEUES:
            served = {
                "acme": 90 if late else 40,
                "globex": 30 + ago % 7,
                "initech": 20 + ago % 5,
                "starved-co": (0 if late else 35) if queue == "reports" else 10,
            }
            for tenant, done in served.items():
                if done:
                    conn.execute(
                        "INSERT INTO rota.service VALUES (%s, %s, %s, %s, %s)",
                        (minute, queues[queue], ids[tenant], done, done * (3 + ago % 4)),
                    )
            backlog = 160 + (36 - ago) * 8 if late and queue == "reports" else 150 + ago % 9
            conn.execute(
                "INSERT INTO rota.queue_history VALUES (%s, %s, %s, 8, %s, %s, %s)",
                (
                    minute,
                    queues[queue],
                    backlog,
                    60.0 * (36 - ago) if late and queue == "reports" else 20.0,
                    sum(served.values()),
                    1 if ago % 11 == 0 else 0,
                ),
            )
    conn.execute(
        "UPDATE rota.tasks SET enqueued_at = now() - interval '35 minutes'"
        " WHERE tenant = 'starved-co' AND queue_id = %s",
        (queues["reports"],),
    )
    db.run(conn, core.refresh_stats())


def series_of(driver: WebDriver, chart: str) -> list[str]:
    script = "return Array.from(document.querySelectorAll(arguments[0]), p => p.dataset.series)"
    paths = f"svg[data-chart='{chart}'] path[data-series]"
    return [str(name) for name in driver.execute_script(script, paths)]


def drawn(driver: WebDriver, chart: str, series: str) -> bool:
    """Whether the series' line has a path over 100 px wide (read in one
    script, so that the page's refresh cannot fall between its steps)."""
    script = (
        "var p = document.querySelector(arguments[0]);"
        " return p && p.getAttribute('d') ? p.getBBox().width : 0"
    )
    path = f"svg[data-chart='{chart}'] path[data-series='{series}']"
    return float(driver.execute_script(script, path)) > 100


def legend_marks(driver: WebDriver) -> list[dict[str, Any]]:
    """Each legend entry of the page: its series, and its mark as drawn (the
    line's computed stroke, width and dash, and the boxes of the mark and
    its line), read in one script."""
    script = """
        return Array.from(document.querySelectorAll('.legend li'), li => {
            var mark = li.querySelector('svg.swatch'), line = mark && mark.querySelector('line');
            if (!line) return {series: li.dataset.series};
            var style = getComputedStyle(line), box = mark.getBoundingClientRect();
            return {series: li.dataset.series, stroke: style.stroke,
                    stroke_width: parseFloat(style.strokeWidth), dash: style.strokeDasharray,
                    opacity: parseFloat(style.opacity) * parseFloat(getComputedStyle(mark).opacity),
                    width: box.width, height: box.height,
                    line_width: line.getBoundingClientRect().width};
        });
    """
    return list(driver.execute_script(script))


def assert_every_series_has_a_visible_mark(driver: WebDriver, dashed: set[str]) -> None:
    marks = legend_marks(driver)
    assert marks, driver.current_url
    for mark in marks:
        where = (driver.current_url, mark)
        assert mark.get("stroke") not in (None, "none", "transparent", "rgba(0, 0, 0, 0)"), where
        assert mark["stroke_width"] >= 2 and mark["opacity"] > 0, where
        assert mark["width"] >= 10 and mark["height"] > 0 and mark["line_width"] >= 10, where
        assert (mark["dash"] != "none") == (mark["series"] in dashed), where


def assert_no_console_errors(driver: WebDriver) -> None:
    """No JavaScript error and no failed request (a favicon's 404 among them)
    in the browser's console, and the page's icon loads as an image."""
    script = """
        var done = arguments[arguments.length - 1], link = document.querySelector('link[rel=icon]');
        if (!link) return done(0);
        var img = new Image();
        img.onload = () => done(img.naturalWidth);
        img.onerror = () => done(-1);
        img.src = link.href;
    """
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    assert driver.execute_async_script(script) > 0, "the page's icon"


def test_the_charts_show_who_is_starved_and_since_when(
    conn: psycopg.Connection[Any],
    dashboard: str,  # noqa: F811
    browser: WebDriver,  # noqa: F811
) -> None:
    seed_an_hour(conn)
    browser.get(dashboard + "/login")
    log_in(browser)

    assert series_of(browser, "throughput") == ["completed", "died"]
    assert series_of(browser, "backlog") == ["reports", "emails"]
    assert series_of(browser, "oldest_wait") == ["reports", "emails"]
    assert drawn(browser, "throughput", "completed") and drawn(browser, "backlog", "reports")
    assert_every_series_has_a_visible_mark(browser, dashed=set())
    assert_no_console_errors(browser)
    browser.save_screenshot(str(SHOTS / "overview-charts.png"))

    browser.get(dashboard + "/charts")
    type_into(browser, "chart-tenant", "starved-co", submit=True)
    wait_for(lambda: "tenant=starved-co" in browser.current_url, what="the search")
    service = series_of(browser, "service")
    assert service[0] == "starved-co" and service[-1] == "other"
    assert set(service[1:-1]) == {"acme", "globex", "initech"}
    assert all(drawn(browser, "service", name) for name in service[:-1])
    for chart in ("throughput", "backlog", "oldest_wait"):
        assert browser.find_elements(By.CSS_SELECTOR, f"svg[data-chart='{chart}']"), chart
    assert_every_series_has_a_visible_mark(browser, dashed=set())
    assert_no_console_errors(browser)
    (ROOT / "docs").mkdir(exist_ok=True)
    browser.save_screenshot(str(ROOT / "docs" / "console-charts.png"))

    # The same lines in the dark scheme: other colours, from the stylesheet.
    line = "svg[data-chart='service'] path.s0"
    stroke = "return getComputedStyle(document.querySelector(arguments[0])).stroke"
    light = browser.execute_script(stroke, line)
    dark_scheme = [{"name": "prefers-color-scheme", "value": "dark"}]
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": dark_scheme})
    dark = browser.execute_script(stroke, line)
    assert light and dark and light != dark
    browser.save_screenshot(str(SHOTS / "charts-dark.png"))
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})

    browser.get(dashboard + "/tenants/starved-co?window=6h")
    assert series_of(browser, "service") == ["completed", "demand", "fair share"]
    assert series_of(browser, "wait") == ["mean wait"]
    # The seeded minutes keep no fair level (rows as before 0035): no line is made up.
    assert drawn(browser, "service", "completed") and drawn(browser, "service", "demand")
    assert not drawn(browser, "service", "fair share")
    # Dashed series too: a mark in their colour and dash, though "fair share" draws no line.
    assert_every_series_has_a_visible_mark(browser, dashed={"demand", "fair share"})
    assert_no_console_errors(browser)
    browser.save_screenshot(str(SHOTS / "tenant-charts.png"))
