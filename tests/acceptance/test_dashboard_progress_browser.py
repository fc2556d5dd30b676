"""A running task's progress in a real browser (headless Chromium): its page
draws a progress bar with its message and when it was reported, and the list
of running tasks a bar per task. Screenshots go to build/screenshots/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from selenium.webdriver.remote.webdriver import WebDriver

from rota import App
from tests.acceptance.test_dashboard_browser import (
    SHOTS,
    browser,
    dashboard,
    log_in,
    text_of,
)
from tests.acceptance.test_progress import enqueue, producer, start_worker
from tests.acceptance.test_workers import stop
from tests.helpers import wait_for

__all__ = ["browser", "dashboard", "producer"]  # fixtures of the modules they come from

# The bar as drawn: its position (value / max) and its width on the page.
BAR = """var bar = document.querySelector(arguments[0]);
return bar ? [bar.position, bar.getBoundingClientRect().width] : null"""


def drawn(browser: WebDriver, css: str) -> tuple[float, float] | None:
    found = browser.execute_script(BAR, css)
    return None if found is None else (float(found[0]), float(found[1]))


def test_a_running_task_shows_its_progress_bar(
    env: dict[str, str],
    producer: App,
    conn: psycopg.Connection[Any],
    dashboard: str,
    browser: WebDriver,
    tmp_path: Path,
) -> None:
    go = tmp_path / "go"
    task_id = enqueue(producer, conn, "refused", str(go))
    worker = start_worker(env, "--concurrency", "1")
    try:
        wait_for(lambda: producer.result(task_id).progress(), what="the task's progress")
        browser.get(dashboard + "/login")
        log_in(browser)
        browser.get(f"{dashboard}/tasks/{task_id}")
        bar = wait_for(lambda: drawn(browser, "#progress-bar"), what="the progress bar")
        assert abs(bar[0] - 2 / 3) < 1e-6 and bar[1] > 50
        assert text_of(browser, "#progress-figures") == "2 of 3 (66.7%)"
        assert text_of(browser, "#progress-message").startswith("xxxx")
        assert text_of(browser, "#progress-message").endswith("…")
        assert "reported" in text_of(browser, "#progress-at")
        browser.save_screenshot(str(SHOTS / "task-progress.png"))

        browser.get(dashboard + "/tasks?state=running")
        bar = wait_for(lambda: drawn(browser, "td.progress progress"), what="the list's bar")
        assert abs(bar[0] - 2 / 3) < 1e-6 and bar[1] > 20
        assert "67%" in text_of(browser, "td.progress")
        browser.save_screenshot(str(SHOTS / "running-progress.png"))
        go.touch()
        assert isinstance(producer.result(task_id).get(timeout=60), list)
    finally:
        stop(worker)
