"""The console against a big queue: how fast each page and API read answers
with (by default) 1M tasks waiting across 10,000 tenants, and claim +
complete throughput with a console refreshing every 2 s beside the same
without one, in alternating runs."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

from rota import db, ops
from rota.settings import Settings
from rota_tools.bench.core import QUEUE, Filler, claim_throughput, reset
from rota_tools.devservers import free_port
from rota_tools.sql import query
from rota_tools.stats import percentile

TOKEN = "bench-console-token-0123"
REFRESH_SECONDS = 2.0
READ_GOAL_MS = 300
RATIO_GOAL = 0.9


class Console:
    """`rota dashboard` in its own process, as an operator runs it."""

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "ROTA_DATABASE_URL": settings.database_url,
            "ROTA_REDIS_URL": settings.redis_url,
            "ROTA_DASHBOARD_TOKEN": TOKEN,
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rota", "dashboard", "--port", str(self.port),
             "--log-level", "warning"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.http.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the console did not start")
            time.sleep(0.1)

    def close(self) -> None:
        self.http.close()
        self.process.terminate()
        self.process.wait(timeout=30)


def _read_times(console: Console, paths: list[str], rounds: int) -> dict[str, dict[str, float]]:
    times: dict[str, list[float]] = {path: [] for path in paths}
    for _ in range(rounds):
        for path in paths:
            started = time.perf_counter()
            response = console.http.get(path)
            elapsed = (time.perf_counter() - started) * 1000
            if response.status_code != 200:
                raise RuntimeError(f"{path} answered {response.status_code}")
            times[path].append(elapsed)
    return {
        path: {"p50_ms": round(statistics.median(t), 1), "max_ms": round(max(t), 1),
               "p90_ms": round(percentile(t, 0.9), 1)}
        for path, t in times.items()
    }  # fmt: skip


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds a process has used (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _refresher(console: Console, stop: threading.Event, pages: list[str]) -> None:
    """A browser left open on the console: every page it shows, every 2 s."""
    while not stop.is_set():
        for path in pages:
            console.http.get(path)
        stop.wait(REFRESH_SECONDS)


def bench_console(
    settings: Settings, tasks: int, tenants: int, connections: int, seconds: float, runs: int
) -> dict[str, Any]:
    url = settings.database_url
    conn = db.connect(url)
    try:
        return _bench(conn, settings, tasks, tenants, connections, seconds, runs)
    finally:
        conn.close()


def _bench(
    conn: psycopg.Connection[Any],
    settings: Settings,
    tasks: int,
    tenants: int,
    connections: int,
    seconds: float,
    runs: int,
) -> dict[str, Any]:
    url = settings.database_url
    reset(conn)
    started = time.perf_counter()
    filler = Filler(conn, tenants, QUEUE)
    filler.add(tasks)
    load_seconds = time.perf_counter() - started
    with db.admin_connect(url) as admin:
        admin.execute(query("bench_analyze"))
        db.run(admin, ops.refresh_stats())
        deep = admin.execute(query("bench_deepest_ready")).fetchone()
        tenant = admin.execute(query("bench_first_tenant")).fetchone()
    assert deep is not None and tenant is not None
    console = Console(settings)
    try:
        paths = [
            "/", "/api/overview", "/tenants", "/api/tenants", "/tenants?sort=name&page=100",
            "/api/tenants?sort=served&page=50", f"/tenants/{tenant[0]}",
            "/tasks?state=ready", f"/tasks/{deep[0]}", f"/api/tasks/{deep[0]}", "/workers",
            "/dead-letters", "/tasks?state=dead", "/metrics",
        ]  # fmt: skip
        _read_times(console, paths[:3], 1)  # warm up: plans, templates
        reads = _read_times(console, paths, 5)
        with_console: list[float] = []
        without: list[float] = []
        stats_stop = threading.Event()
        # Maintenance recounts the console's figures whether a console is open
        # or not: both arms pay for it.
        stats = threading.Thread(
            target=_stats_duty, args=(url, settings.stats_seconds, stats_stop), daemon=True
        )
        stats.start()
        console_cpu = 0.0
        for _ in range(runs):
            # Each run starts with the whole backlog waiting.
            filler.fill(tasks)
            without.append(claim_throughput("rota", url, connections, 100, seconds))
            filler.fill(tasks)
            cpu_before = _cpu_seconds(console.process.pid)
            stop = threading.Event()
            refresher = threading.Thread(
                target=_refresher, args=(console, stop, ["/", "/tenants", "/metrics"])
            )
            refresher.start()
            try:
                with_console.append(claim_throughput("rota", url, connections, 100, seconds))
            finally:
                stop.set()
                refresher.join()
            console_cpu += _cpu_seconds(console.process.pid) - cpu_before
        stats_stop.set()
        stats.join()
    finally:
        console.close()
    slowest = max(r["p50_ms"] for r in reads.values())
    ratio = statistics.median(with_console) / statistics.median(without)
    return {
        "params": {"tasks": tasks, "tenants": tenants, "connections": connections,
                   "seconds": seconds, "runs": runs, "refresh_seconds": REFRESH_SECONDS},
        "load_seconds": round(load_seconds, 1),
        "reads": reads,
        "slowest_read_p50_ms": slowest,
        "claim_complete_tasks_per_s": {
            "without_console": round(statistics.median(without)),
            "with_console": round(statistics.median(with_console)),
            "runs": {"without_console": [round(x) for x in without],
                     "with_console": [round(x) for x in with_console]},
        },
        "ratio_with_to_without": round(ratio, 3),
        # The console process's own CPU while the refresher ran, per second.
        "console_cpu_share": round(console_cpu / (runs * seconds), 3),
        "goal": {"read_p50_ms_at_most": READ_GOAL_MS, "ratio_at_least": RATIO_GOAL},
        "met": {"reads": slowest <= READ_GOAL_MS, "ratio": ratio >= RATIO_GOAL},
    }  # fmt: skip


def _stats_duty(url: str, every: float, stop: threading.Event) -> None:
    with db.connect(url) as conn:
        while not stop.is_set():
            try:
                db.run(conn, ops.count_service())
                db.run(conn, ops.refresh_stats())
            except psycopg.Error:
                return
            stop.wait(every)
