"""The console against a big queue: how fast each page and API read answers
with (by default) 1M tasks waiting across 10,000 tenants, and claim +
complete throughput with a console refreshing every 2 s beside the same
without one, in neighbouring windows of the same claim runs."""

from __future__ import annotations

import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg

from rota import core
from rota.core import db
from rota.core.connections import application_name
from rota.errors import RotaError
from rota.settings import Settings
from rota_tools.bench.cpu import process_seconds
from rota_tools.bench.harness import QUEUE, Filler, claim_run, in_background, reset, wait_for
from rota_tools.devservers import free_port
from rota_tools.processes import spawn_console
from rota_tools.sql import query
from rota_tools.stats import percentile

TOKEN = "bench-console-token-0123"
REFRESH_SECONDS = 2.0
# An open console's pages, as a browser left on them refreshes them.
REFRESHED = ["/", "/tenants", "/metrics"]
# Two refreshes per window; the console's cache (half of ROTA_STATS_SECONDS)
# serves every other one, as it does a browser refreshing every 2 s.
WINDOW_SECONDS = 4.0
READ_GOAL_MS = 300
RATIO_GOAL = 0.9


class Console:
    """`rota dashboard` in its own process, as an operator runs it."""

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = spawn_console(settings, self.port, TOKEN)
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
        )
        wait_for(
            lambda: self.http.get("/healthz").status_code == 200,
            60,
            what="the console to start",
            poll=0.1,
            errors=(httpx.TransportError,),
        )

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
        path: {
            "p50_ms": round(statistics.median(t), 1),
            "max_ms": round(max(t), 1),
            "p90_ms": round(percentile(t, 0.9), 1),
        }
        for path, t in times.items()
    }


def _console_cpu(console: Console, url: str) -> dict[int, float]:
    """CPU seconds used so far by the console's process and by the server
    processes of its database connections, by pid."""
    with db.connect(url, "admin") as conn:
        pids = [
            row[0]
            for row in conn.execute(
                query("bench_backends_of"), {"application": application_name("console")}
            )
        ]
    return {pid: process_seconds(pid) or 0.0 for pid in [console.process.pid, *pids]}


def bench_console(
    settings: Settings,
    tasks: int,
    tenants: int,
    connections: int,
    seconds: float,
    runs: int,
    window: float = WINDOW_SECONDS,
) -> dict[str, Any]:
    if seconds < 2 * window:
        raise RotaError("--seconds must hold at least two windows (one pair)")
    url = settings.database_url
    with db.connect(url) as conn:
        reset(conn)
        started = time.perf_counter()
        filler = Filler(conn, tenants, QUEUE)
        filler.add(tasks)
        load_seconds = time.perf_counter() - started
        with db.connect(url, "admin") as admin:
            admin.execute(query("bench_analyze"))
            db.run(admin, core.refresh_stats())
            deep = admin.execute(query("bench_deepest_ready")).fetchone()
            tenant = admin.execute(query("bench_first_tenant")).fetchone()
        assert deep is not None and tenant is not None
        console = Console(settings)
        try:
            paths = [
                "/",
                "/api/overview",
                "/tenants",
                "/api/tenants",
                "/tenants?sort=name&page=100",
                "/api/tenants?sort=served&page=50",
                f"/tenants/{tenant[0]}",
                "/tasks?state=ready",
                f"/tasks/{deep[0]}",
                f"/api/tasks/{deep[0]}",
                "/workers",
                "/dead-letters",
                "/tasks?state=dead",
                "/metrics",
            ]
            _read_times(console, paths[:3], 1)  # warm up: plans, templates
            reads = _read_times(console, paths, 5)
            # Maintenance recounts the console's figures whether a console is open
            # or not: both arms pay for it.
            with in_background(lambda: db.connect(url), _stats_duty, settings.stats_seconds):
                pairs, console_cpu, console_seconds = _side_by_side(
                    console, filler, url, tasks, connections, seconds, runs, window
                )
        finally:
            console.close()
        slowest = max(r["p50_ms"] for r in reads.values())
        ratios = [on / off for off, on in pairs if off > 0]
        ratio = statistics.median(ratios)
        without = sum(off for off, _ in pairs) / (len(pairs) * window)
        with_console = sum(on for _, on in pairs) / (len(pairs) * window)
        return {
            "params": {
                "tasks": tasks,
                "tenants": tenants,
                "connections": connections,
                "seconds": seconds,
                "runs": runs,
                "refresh_seconds": REFRESH_SECONDS,
                "window_seconds": window,
            },
            "load_seconds": round(load_seconds, 1),
            "reads": reads,
            "slowest_read_p50_ms": slowest,
            "claim_complete_tasks_per_s": {
                "without_console": round(without),
                "with_console": round(with_console),
            },
            # Each pair is two neighbouring windows of one claim run, one with the
            # console refreshing and one without: the median of their ratios.
            "ratio_with_to_without": round(ratio, 3),
            "pairs": len(ratios),
            "pair_ratios": sorted(round(r, 3) for r in ratios),
            "ratio_of_totals": round(with_console / without, 3),
            # CPU used by the console and by its connections' server processes
            # while it refreshed, as a share of all the machine's cores.
            "console_cpu_share": round(console_cpu / (console_seconds * (os.cpu_count() or 1)), 4),
            "goal": {"read_p50_ms_at_most": READ_GOAL_MS, "ratio_at_least": RATIO_GOAL},
            "met": {"reads": slowest <= READ_GOAL_MS, "ratio": ratio >= RATIO_GOAL},
        }


def _side_by_side(
    console: Console,
    filler: Filler,
    url: str,
    tasks: int,
    connections: int,
    seconds: float,
    runs: int,
    window: float,
) -> tuple[list[tuple[int, int]], float, float]:
    """Claim + complete runs of `seconds` each, cut into windows of `window`
    seconds with the console refreshing in every other one. Both
    windows of a pair share the machine's state of the moment, which on a
    shared machine drifts by more than the console's cost between runs.
    Returns the pairs' completions (without, with), the console's CPU
    seconds and the seconds it refreshed."""
    pairs: list[tuple[int, int]] = []
    console_cpu = console_seconds = 0.0
    for _ in range(runs):
        _prepare(filler, url, tasks)
        windows = int(seconds // window)
        # Pairs alternate their order (off, on), (on, off): a trend within the
        # run falls on both arms alike.
        plan = [(k % 4) in (1, 2) for k in range(windows - windows % 2)]
        cpu_before = _console_cpu(console, url)
        go = threading.Event()
        with ThreadPoolExecutor(1) as pool:
            toggler = pool.submit(_toggle, console, plan, window, go)
            try:
                # The windows start once every claiming process is up.
                claim_run(Filler, url, connections, 100, seconds + window, go.set)
            finally:
                go.set()
            start = toggler.result()  # a failed refresh fails the benchmark
        if not filler.waiting():
            raise RotaError("the backlog ran out in a run: give more --tasks or fewer --seconds")
        cpu_after = _console_cpu(console, url)
        console_cpu += sum(v - cpu_before.get(k, 0.0) for k, v in cpu_after.items())
        console_seconds += sum(plan) * window
        with db.connect(url, "admin") as admin:
            done = dict(
                admin.execute(
                    query("bench_finished_per_window"),
                    {"start": start, "window": window, "windows": len(plan)},
                ).fetchall()
            )
        counts = [done.get(k, 0) for k in range(len(plan))]
        for k in range(0, len(plan), 2):
            first, second = counts[k], counts[k + 1]
            pairs.append((second, first) if plan[k] else (first, second))
    return pairs, console_cpu, console_seconds


def _toggle(
    console: Console,
    plan: list[bool],
    window: float,
    go: threading.Event,
) -> float:
    """Once `go` is set, runs the refresher in the windows the plan marks, on
    a fixed clock (wall-clock seconds, as the database stamps completions);
    returns when the first window began."""
    go.wait()
    start = time.time() + window  # the first window is warm-up, not counted
    for k, on in enumerate(plan):
        begin, end = start + k * window, start + (k + 1) * window
        time.sleep(max(0.0, begin - time.time()))
        while on and time.time() < end:
            for path in REFRESHED:
                console.http.get(path)
            time.sleep(max(0.0, min(REFRESH_SECONDS, end - time.time())))
    time.sleep(max(0.0, start + len(plan) * window - time.time()))
    return start


def _prepare(filler: Filler, url: str, tasks: int) -> None:
    """The whole backlog waiting again, and the tables vacuumed."""
    filler.fill(tasks)
    with db.connect(url, "admin") as admin:
        admin.execute(query("bench_vacuum_queue"))


def _stats_duty(conn: psycopg.Connection[Any]) -> bool:
    try:
        db.run(conn, core.count_service())
        db.run(conn, core.refresh_stats())
    except psycopg.Error:
        return False
    return True
