"""`make demo` / `rota demo`: watch a noisy neighbour not starve anyone.

PostgreSQL and Redis: those of ROTA_DATABASE_URL and ROTA_REDIS_URL when
set, else the embedded ones (rota.runtime.embedded) in a temporary
directory. One tenant floods 100,000 tasks; a steady tenant and 50 small
tenants trickle work in meanwhile. The Spark loader (local mode; the Python
loader where there is no Java) moves the buffer into PostgreSQL; two worker
processes run tasks of a few milliseconds. At the end: each tenant group's
wait (p50/p99) beside the same arrivals served first-in-first-out at the same
throughput, and a PNG chart of wait over time.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from psycopg.rows import class_row
from rich.console import Console
from rich.live import Live
from rich.table import Table

import rota
from rota import core
from rota.core import db
from rota_tools.sql import query
from rota_tools.stats import percentile


class Finished(NamedTuple):
    """A finished task of the demo (demo_finished), times in epoch seconds."""

    tenant: str
    enqueued: float
    started: float
    finished: float


app = rota.App.from_env()
QUEUE = "demo"
WARM_UP = "warm-up"
TASK_MS = 2.0


@app.task(queue=QUEUE)
def work(milliseconds: float) -> None:
    time.sleep(milliseconds / 1000)


@dataclass
class Run:
    flood: int
    small_tenants: int
    workers: int
    concurrency: int
    trickle_per_second: float
    loader: str = "auto"


def _group(tenant: str) -> str:
    return "small" if tenant.startswith("small-") else tenant


def _progress(conn: Any) -> Table:
    rows = conn.execute(query("demo_done_by_tenant")).fetchall()
    done: dict[str, int] = defaultdict(int)
    for tenant, count in rows:
        done[_group(tenant)] += count
    counts = db.run(conn, core.queue_counts()).get(QUEUE, {})
    table = Table(title="rota demo: flood vs steady vs 50 small tenants")
    # Claimed counts what the workers hold, started or prefetched.
    for column in ("waiting", "claimed", "done flood", "done steady", "done small"):
        table.add_column(column, justify="right")
    waiting, claimed = counts.get("ready", 0), counts.get("running", 0)
    table.add_row(*map(str, (waiting, claimed, done["flood"], done["steady"], done["small"])))
    return table


def _done_of(conn: Any, tenant: str) -> int:
    row = conn.execute(query("demo_done_of_tenant"), {"tenant": tenant}).fetchone()
    return int(row[0]) if row else 0


@dataclass
class DemoConsole:
    process: subprocess.Popen[bytes]
    url: str
    token: str

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def _start_console(settings: rota.Settings) -> DemoConsole:
    """`rota dashboard` beside the demo, with a token of the run's own."""
    from rota_tools.devservers import free_port
    from rota_tools.processes import spawn_console

    port, token = free_port(), secrets.token_urlsafe(12)
    return DemoConsole(spawn_console(settings, port, token), f"http://127.0.0.1:{port}", token)


@contextlib.contextmanager
def _servers(console: Console) -> Iterator[rota.Settings]:
    """The settings' servers when a URL is set (environment or .env), else
    the embedded ones, in a directory removed at the end."""
    from rota.runtime import embedded

    settings = rota.Settings()
    if settings.model_fields_set & {"database_url", "redis_url"}:
        yield settings
        return
    directory = Path(tempfile.mkdtemp(prefix="rota-demo-"))
    try:
        console.print("[bold]no ROTA_DATABASE_URL / ROTA_REDIS_URL: starting the embedded servers")
        with embedded.running(directory) as servers:
            yield settings.model_copy(
                update={"database_url": servers.database_url, "redis_url": servers.redis_url}
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class DemoLoader(NamedTuple):
    thread: threading.Thread
    stop: Callable[[], None]


def _start_loader(
    settings: rota.Settings, stop: threading.Event, console: Console, engine: str
) -> DemoLoader:
    """The loader in a thread: `engine` "spark" (local mode), "python", or
    "auto": Spark where there is Java for it, else Python."""
    if engine == "auto":
        engine = "spark" if shutil.which("java") or os.environ.get("JAVA_HOME") else "python"
    if engine not in ("spark", "python"):
        raise ValueError(f"unknown loader {engine!r}: use auto, spark or python")
    if engine == "python":
        from rota.loader import Loader

        console.print("[bold]starting the Python loader ...")
        loader = Loader(settings)

        def load() -> None:
            try:
                loader.run_forever(stop.is_set)
            finally:
                loader.close()

        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        return DemoLoader(thread, lambda: None)

    from rota.loader.spark import run_streaming, spark_session

    console.print("[bold]starting the Spark loader (local mode) ...")
    spark = spark_session("local[2]", "rota-demo")
    checkpoint = tempfile.mkdtemp(prefix="rota-demo-ckpt-")
    thread = threading.Thread(
        target=run_streaming,
        kwargs={
            "settings": settings,
            "checkpoint": checkpoint,
            "trigger_seconds": 0.5,
            "should_stop": stop.is_set,
            "session": spark,
        },
        daemon=True,
    )
    thread.start()

    def close() -> None:
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)

    return DemoLoader(thread, close)


def run_demo(run: Run, out_dir: Path, console: Console) -> dict[str, Any]:
    from rota.core.migrate import migrate
    from rota_tools.processes import spawn_workers, stop_workers

    with _servers(console) as settings:
        producer = rota.App(settings)
        producer.tasks["work"] = work
        conn = db.connect(settings.database_url)
        migrate(conn)
        dashboard = _start_console(settings)
        console.print(
            f"[bold]console: {dashboard.url}/  (log in with the token {dashboard.token}; "
            "it stays up while the flood runs)"
        )

        stop = threading.Event()
        loader = _start_loader(settings, stop, console, run.loader)
        workers = spawn_workers(
            "rota_tools.demo:app",
            [QUEUE],
            run.workers,
            settings,
            concurrency=run.concurrency,
            batch_size=50,
            poll_seconds=0.5,
        )

        def trickle() -> None:
            rng = random.Random(7)
            while not stop.is_set():
                tenant = rng.choice(
                    ["steady"] + [f"small-{i:02d}" for i in range(run.small_tenants)]
                )
                producer.enqueue_many([work.using(tenant=tenant).prepare(TASK_MS)])
                time.sleep(1 / run.trickle_per_second)

        try:
            # The loader's start-up (Spark's session, its first micro-batch) is
            # not the steady state whose fairness the demo shows: one task goes
            # through first.
            console.print("[bold]warming up the pipeline (the loader's first batch) ...")
            producer.enqueue_many([work.using(tenant=WARM_UP).prepare(TASK_MS)])
            while _done_of(conn, WARM_UP) < 1:
                time.sleep(0.2)
            started = time.monotonic()
            console.print(f"[bold]flood: {run.flood:,} tasks for one tenant; others trickle in")
            for i in range(0, run.flood, 10_000):
                producer.enqueue_many(
                    [
                        work.using(tenant="flood").prepare(TASK_MS)
                        for _ in range(min(10_000, run.flood - i))
                    ]
                )
            trickler = threading.Thread(target=trickle, daemon=True)
            trickler.start()
            if console.is_terminal:
                with Live(_progress(conn), console=console, refresh_per_second=2) as live:
                    while _done_of(conn, "flood") < run.flood:
                        time.sleep(0.5)
                        live.update(_progress(conn))
            else:
                # To a file or pipe: no redrawn table, one final table on lines
                # of its own.
                while _done_of(conn, "flood") < run.flood:
                    time.sleep(0.5)
                console.print(_progress(conn))
                console.print()
            stop.set()
            trickler.join()
            elapsed = time.monotonic() - started
        finally:
            stop.set()
            dashboard.stop()
            stop_workers(workers)
            loader.thread.join(timeout=60)
            loader.stop()

        finished = conn.cursor(row_factory=class_row(Finished))
        rows = finished.execute(query("demo_finished"), {"warm_up": WARM_UP}).fetchall()
        conn.close()
        producer.close()

    waits: dict[str, list[float]] = defaultdict(list)
    timeline: dict[str, list[tuple[float, float]]] = defaultdict(list)
    first = min(r.enqueued for r in rows)
    for r in rows:
        wait_ms = (r.started - r.enqueued) * 1000
        waits[_group(r.tenant)].append(wait_ms)
        timeline[_group(r.tenant)].append((r.enqueued - first, wait_ms))
    span = max(r.finished for r in rows) - min(r.started for r in rows)
    throughput = len(rows) / span
    fifo_timeline = _fifo_timeline(rows, throughput, run.workers * run.concurrency)
    fifo = {group: [wait for _, wait in points] for group, points in fifo_timeline.items()}
    total = len(rows)
    summary = {
        group: {
            "tasks": len(values),
            "share": round(len(values) / total, 4),
            "wait_p50_ms": round(statistics.median(values), 1),
            "wait_p99_ms": round(percentile(values, 0.99), 1),
            "fifo_wait_p50_ms": round(statistics.median(fifo[group]), 1),
            "fifo_wait_p99_ms": round(percentile(fifo[group], 0.99), 1),
        }
        for group, values in sorted(waits.items())
    }
    table = Table(
        title=f"per tenant group: rota vs plain FIFO ({throughput:,.0f} tasks/s, {elapsed:.0f} s)"
    )
    columns = ["group", "tasks", "share", "wait p50 ms", "wait p99 ms", "FIFO p50 ms"]
    for column in (*columns, "FIFO p99 ms"):
        table.add_column(column, justify="right")
    wait_keys = ("wait_p50_ms", "wait_p99_ms", "fifo_wait_p50_ms", "fifo_wait_p99_ms")
    for group, s in summary.items():
        table.add_row(
            group, f"{s['tasks']:,}", f"{s['share']:.1%}", *(f"{s[w]:,}" for w in wait_keys)
        )
    console.print(table)
    chart = _chart(timeline, fifo_timeline, path=out_dir / "rota-demo-wait.png")
    console.print(f"chart: {chart}")
    return {"throughput_tasks_per_s": round(throughput), "groups": summary, "chart": str(chart)}


def _fifo_timeline(
    rows: list[Finished], throughput: float, parallel: int
) -> dict[str, list[tuple[float, float]]]:
    """The same arrivals served first-in-first-out at the measured throughput
    (`parallel` servers, ready when the real run's first task started, so the
    pipeline's warm-up counts for both): (arrival second, wait ms) per group."""
    service = parallel / throughput
    ordered = sorted((r.enqueued, r.tenant) for r in rows)
    first = ordered[0][0]
    free_at = [min(r.started for r in rows)] * parallel
    timeline: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for arrived, tenant in ordered:
        server = min(range(parallel), key=free_at.__getitem__)
        start = max(arrived, free_at[server])
        free_at[server] = start + service
        timeline[_group(tenant)].append((arrived - first, (start - arrived) * 1000))
    return timeline


def _chart(
    timeline: dict[str, list[tuple[float, float]]],
    fifo_timeline: dict[str, list[tuple[float, float]]],
    path: Path,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for axis, data, title in (
        (left, timeline, "rota (fair)"),
        (right, fifo_timeline, "plain FIFO, same arrivals"),
    ):
        for group, points in sorted(data.items()):
            if group == "flood":
                continue
            points.sort()
            axis.scatter([p[0] for p in points], [p[1] / 1000 for p in points], s=6, label=group)
        axis.set_title(title)
        axis.set_xlabel("enqueued at (s since start)")
        axis.grid(alpha=0.3)
    left.set_ylabel("wait before start (s)")
    left.legend()
    figure.suptitle("wait of the quiet tenants while one tenant floods 100,000 tasks")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(
    flood: int = 100_000, small_tenants: int = 50, out: str = "demo-out", loader: str = "auto"
) -> dict[str, Any]:
    console = Console()
    if not console.is_terminal:
        # To a file or pipe: lines are not cut at 80 columns (a URL, a
        # table's headers); tables keep their own width.
        console = Console(width=200, soft_wrap=True)
    return run_demo(
        Run(
            flood=flood,
            small_tenants=small_tenants,
            workers=2,
            concurrency=32,
            trickle_per_second=40,
            loader=loader,
        ),
        Path(out),
        console,
    )
