"""The console in a real browser (Debian's Chromium, headless, driven by
Selenium): an operator logs in while a flood waits, finds a task by id and
reads why it waits, retries a dead task and sees it complete; the tenants
page holds 10,000 tenants. Screenshots go to build/screenshots/."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from rota import App, core
from rota.core import db
from rota_tools.devservers import free_port
from tests.acceptance.test_workers import start_worker, stop
from tests.helpers import envelopes, load, start_logged, wait_for

ROOT = Path(__file__).parent.parent.parent
SHOTS = ROOT / "build" / "screenshots"
TOKEN = "browser-test-token-0123"
T = TypeVar("T")


@pytest.fixture
def dashboard(env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    process = start_logged(
        [sys.executable, "-m", "rota", "dashboard", "--port", str(port)],
        env={**env, "ROTA_DASHBOARD_TOKEN": TOKEN, "ROTA_STATS_SECONDS": "0.5"},
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/healthz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(up, what="the console to listen")
        yield url
    finally:
        stop(process)


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "Debian's chromium and chromium-driver (infra/install-servers.sh)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    # The browser's console, for the tests that read its errors (a 404 among them).
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    session = webdriver.Chrome(service=Service(driver), options=options)
    session.implicitly_wait(5)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield session
    finally:
        session.quit()


def steady(act: Callable[[], T], tries: int = 20) -> T:
    """Runs `act` again when the page's live refresh (base.html swaps #main
    every few seconds) replaced an element it held between finding and using."""
    for _ in range(tries - 1):
        try:
            return act()
        except StaleElementReferenceException:
            continue
    return act()


def text_of(browser: WebDriver, css: str) -> str:
    """The element's text, read in one script so that no refresh falls
    between finding it and reading it ("" while it is not on the page)."""
    script = "var e = document.querySelector(arguments[0]); return e ? e.innerText : ''"
    return str(browser.execute_script(script, css))


def rows_of(browser: WebDriver, css: str) -> list[str]:
    """The texts of every element `css` selects, read in one script."""
    script = "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText)"
    return [str(text) for text in browser.execute_script(script, css)]


def log_in(browser: WebDriver) -> None:
    """Logs in on the login page the browser shows, and waits for the overview."""
    type_into(browser, "token", TOKEN)
    steady(lambda: browser.find_element(By.ID, "login").click())
    wait_for(lambda: "Overview" in browser.title, what="the overview")


def type_into(browser: WebDriver, element_id: str, text: str, submit: bool = False) -> None:
    def act() -> None:
        box = browser.find_element(By.ID, element_id)
        box.send_keys(text)
        if submit:
            box.submit()

    steady(act)


def test_an_operator_finds_a_task_reads_why_and_retries_a_dead_one(
    env: dict[str, str],
    producer: App,
    conn: psycopg.Connection[Any],
    dashboard: str,
    browser: WebDriver,
) -> None:
    # A flood in a queue no worker serves, and one quiet tenant's task behind it.
    load(conn, envelopes("flood", 5_000, queue="reports") + envelopes("quiet", 1, queue="reports"))
    (quiet,) = [row[0] for row in conn.execute("SELECT id FROM rota.tasks WHERE tenant = 'quiet'")]
    # A task that died of a bug since fixed (its worker's app runs it fine now).
    sleep_task = producer.tasks["sleep"]
    (dead,) = producer.enqueue_many(
        [sleep_task.using(tenant="acme").prepare(0.01)], connection=conn
    )
    (claimed,) = db.transact(conn, core.claim(["work"], 1, "old-worker"))
    trace = "Traceback ...\nValueError: bug"
    failure = core.Failure(dead, claimed.attempt, "ValueError: bug", final=True, traceback=trace)
    db.transact(conn, core.fail([failure]))
    worker = start_worker(env)
    try:
        browser.get(dashboard + "/")
        assert "Log in" in browser.title
        log_in(browser)
        wait_for(lambda: text_of(browser, "#total-waiting") not in ("", "0"), what="figures")
        browser.save_screenshot(str(SHOTS / "overview.png"))

        type_into(browser, "find-task", str(quiet), submit=True)
        wait_for(lambda: str(quiet) in text_of(browser, "#task-id"), what="the task page")
        why = text_of(browser, "#why")
        assert why.startswith("ready: in line, with 1 claimable tasks ahead of it in queue reports")
        assert "no live worker claims queue reports" in why
        browser.save_screenshot(str(SHOTS / "task-why.png"))

        browser.get(dashboard + "/tasks?state=dead")
        assert "ValueError: bug" in text_of(browser, "#tasks")
        browser.save_screenshot(str(SHOTS / "dead.png"))
        retry = f"form[action='/actions/tasks/{dead}/retry'] button"
        steady(lambda: browser.find_element(By.CSS_SELECTOR, retry).click())
        wait_for(lambda: "Done" in text_of(browser, "#done"), what="the retry to be done")
        browser.get(f"{dashboard}/tasks/{dead}")

        def succeeded() -> bool:
            browser.refresh()
            return text_of(browser, "#where") == "succeeded"

        wait_for(succeeded, timeout=60, what="the retried task to run")
        assert text_of(browser, "#why").startswith("succeeded")
        browser.save_screenshot(str(SHOTS / "retried.png"))
    finally:
        stop(worker)
    actions = [row[0] for row in conn.execute("SELECT action FROM rota.audit")]
    assert actions == ["retry"]


def test_the_tenants_page_with_ten_thousand_tenants(
    conn: psycopg.Connection[Any], dashboard: str, browser: WebDriver
) -> None:
    load(conn, [e for i in range(10_000) for e in envelopes(f"tenant-{i:05d}", 1 + i % 3)])
    db.run(conn, core.refresh_stats())
    browser.get(dashboard + "/login")
    log_in(browser)
    started = time.monotonic()
    browser.get(dashboard + "/tenants")
    loaded = time.monotonic() - started
    assert "(10,000)" in text_of(browser, "h1")
    rows = rows_of(browser, "#tenants tr")
    assert len(rows) == 51  # the header and one page
    assert rows[1].split()[0].startswith("tenant-") and "3" in rows[1].split()
    steady(lambda: browser.find_element(By.ID, "next").click())
    wait_for(lambda: "page 2 of 200" in browser.page_source, what="the second page")
    browser.get(dashboard + "/tenants?sort=name&order=asc&prefix=tenant-0999")
    rows = rows_of(browser, "#tenants tr")
    names = [row.split()[0] for row in rows[1:]]
    assert names == [f"tenant-0999{i}" for i in range(10)]
    browser.save_screenshot(str(SHOTS / "tenants.png"))
    print(f"tenants page with 10,000 tenants: {loaded * 1000:.0f} ms")


def test_the_overview_refreshes_itself_while_open(
    conn: psycopg.Connection[Any], dashboard: str, browser: WebDriver
) -> None:
    load(conn, envelopes("acme", 3))
    db.run(conn, core.refresh_stats())
    browser.get(dashboard + "/login")
    log_in(browser)
    wait_for(lambda: text_of(browser, "#total-waiting") == "3", what="the first figures")
    load(conn, envelopes("globex", 4))
    db.run(conn, core.refresh_stats())
    # No reload: the page's own refresh (every few seconds) brings the new figure.
    wait_for(lambda: text_of(browser, "#total-waiting") == "7", what="the refreshed figures")
    assert browser.execute_script("return performance.getEntriesByType('navigation').length") == 1
