"""What every `rota bench` scenario shares: the throwaway servers and the
JSON report, the bench's tasks and queues, the processes it starts, the one
wait for a condition (a drained queue, a process up), and medians; the CPU
meters are in rota_tools.bench.cpu. Scenarios import from here and from the
parts they own, never from one another (pyproject.toml's import-linter
contract).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import platform
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.pool import Pool
from typing import Any, Protocol

import psycopg
from psycopg import sql

from rota import App, Settings, core
from rota.buffer import redis_client
from rota.buffer.streams import all_streams
from rota.core import db
from rota.core.migrate import migrate
from rota.model.envelope import TaskEnvelope, make_envelope
from rota.runtime.process import tune_gc
from rota_tools.processes import spawn_workers, stop_workers
from rota_tools.sql import query
from rota_tools.stats import percentile

QUEUE = "bench"
NOOP_APP = "rota_tools.bench.noop:app"  # the workers' app (rota_tools.bench.noop)
BATCH = 10_000  # tasks a load (or an `enqueue_many`) of the bench's own
PAD = "payload-padding-abcdefghij"
WARM_UP = "warm-up"  # the tenant of an untimed task that shows a pipeline is up

# A throwaway benchmark server keeps commit timestamps: `rota bench load`
# times enqueue -> commit (claimable) from them.
BENCH_POSTGRES = {"track_commit_timestamp": "on"}

Conn = psycopg.Connection[Any]
Process = subprocess.Popen[bytes]
# Which tenant the i-th task of a bench's backlog belongs to, of `tenants`.
TenantOf = Callable[[int, int], str]


@contextlib.contextmanager
def bench_settings(
    database_url: str | None,
    redis_url: str | None,
    local: bool | None,
    statements: bool = False,
    postgres: Mapping[str, str] | None = None,
) -> Iterator[Settings]:
    """Settings for a benchmark, schema migrated: the given servers, or
    throwaway local ones (with pg_stat_statements, if asked, and the
    scenario's own `postgres` settings)."""
    from rota.cli.app import settings_from
    from rota_tools.devservers import local_postgres, local_redis

    configured = database_url or "ROTA_DATABASE_URL" in os.environ
    with contextlib.ExitStack() as stack:
        if local if local is not None else not configured:
            extra = {"shared_preload_libraries": "pg_stat_statements"} if statements else {}
            pg = stack.enter_context(
                local_postgres({**BENCH_POSTGRES, **extra, **(postgres or {})})
            )
            rd = stack.enter_context(local_redis())
            settings = settings_from(pg.url, rd.url)
        else:
            settings = settings_from(database_url, redis_url)
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            migrate(conn)
        yield settings


def fresh_database(url: str, name: str) -> str:
    """A new empty database `name` on `url`'s server (dropped first if it
    exists); returns its URL."""
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return url.rsplit("/", 1)[0] + "/" + name


def stamped(scenario: str, figures: dict[str, Any]) -> dict[str, Any]:
    """A scenario's JSON report: its figures with when and where they were
    measured (`rota bench compare` and `rota bench report` read both)."""
    machine = {"cpus": os.cpu_count(), "python": platform.python_version()}
    machine["platform"] = platform.platform()
    return {
        "scenario": scenario,
        "at": datetime.now(UTC).isoformat(),
        "machine": machine,
        **figures,
    }


def skewed_tenant(i: int, tenants: int) -> str:
    """1,000 tenants by default, one of them holding half the tasks."""
    if i % 2 == 0 or tenants == 1:
        return "t0000"
    return f"t{1 + (i // 2) % (tenants - 1):04d}"


def even_tenant(i: int, tenants: int) -> str:
    """The tenants holding equal shares of the tasks, in turn."""
    return f"t{i % tenants:04d}"


def bench_task(number: int, queue: str, tenant: str, priority: int, now: datetime) -> TaskEnvelope:
    """The benchmarks' task number `number` (its number is its first argument)."""
    return make_envelope(
        name="bench.noop",
        queue=queue,
        tenant=tenant,
        args=[number, PAD],
        now=now,
        priority=priority,
    )


def make_tasks(
    count: int, tenants: int, start: int = 0, queue: str = QUEUE, priorities: Sequence[int] = (0,)
) -> Iterator[TaskEnvelope]:
    """Task i is at priority priorities[i % len(priorities)] (mixed: 0,0,0,5,9)."""
    now = datetime.now(UTC)
    for i in range(start, start + count):
        yield bench_task(i, queue, skewed_tenant(i, tenants), priorities[i % len(priorities)], now)


def load(conn: Conn, tasks: Iterator[TaskEnvelope] | Sequence[TaskEnvelope]) -> None:
    """Loads the tasks straight into PostgreSQL, BATCH a transaction."""
    rows = iter(tasks)
    while batch := list(itertools.islice(rows, BATCH)):
        db.transact(conn, core.load(batch))


def reset(conn: Conn) -> None:
    """rota's schema, its tables empty: where each run starts."""
    migrate(conn)
    conn.execute(query("bench_reset"))


def bench_app(settings: Settings) -> App:
    """A producer's app with the workers' no-op task (`noop`, on QUEUE)."""
    app = App(settings)
    app.task(name="noop", queue=QUEUE)(lambda i, pad: None)
    return app


def flush_buffer(settings: Settings) -> None:
    client = redis_client.connect(settings)
    for stream in all_streams(settings.stream_prefix, settings.shards):
        client.delete(stream)  # one key per command: on a cluster, each its own slot
    client.close()


def empty(conn: Conn, settings: Settings) -> None:
    """No task in PostgreSQL and none in the buffer: where each run starts."""
    reset(conn)
    flush_buffer(settings)


def fill_buffer(app: App, tasks: int, tenants: int, tenant_of: TenantOf = skewed_tenant) -> None:
    noop = app.tasks["noop"]
    for i in range(0, tasks, BATCH):
        app.enqueue_many(
            [
                noop.using(tenant=tenant_of(j, tenants)).prepare(j, "pad")
                for j in range(i, min(tasks, i + BATCH))
            ]
        )


@dataclass
class Backlog:
    """The tasks each run of a load bench finds in the buffer: `tasks` of
    `tenants`, spread by `tenant_of`, sent by `app`."""

    settings: Settings
    app: App
    tasks: int
    tenants: int
    tenant_of: TenantOf = skewed_tenant

    def fill(self, conn: Conn) -> None:
        """An empty queue and the backlog in the buffer."""
        empty(conn, self.settings)
        fill_buffer(self.app, self.tasks, self.tenants, self.tenant_of)

    def check_loaded(self, conn: Conn, warm_up_tasks: int = 0) -> None:
        assert ready(conn) == self.tasks + warm_up_tasks, "a run did not load every task"


def ready(conn: Conn, queue: str = QUEUE) -> int:
    """Tasks of `queue` waiting in line."""
    return int(db.run(conn, core.queue_counts()).get(queue, {}).get("ready", 0))


def warm_up(app: App, conn: Conn) -> None:
    """Enqueues the warm-up task and waits until the running loader has loaded
    it: the loader is up (Spark's first micro-batch is slow)."""
    app.tasks["noop"].using(tenant=WARM_UP).enqueue(0, "warm-up")
    wait_for(lambda: ready(conn) >= 1, 120, what="the loader to load a task")


def offer(tasks: int, rate: float, send: Callable[[int, int], object]) -> float:
    """Sends `tasks` at `rate` tasks/s, a tick's worth every 20 ms: `send(first,
    n)` sends tasks first .. first + n - 1. Returns when sending started
    (time.perf_counter)."""
    started = time.perf_counter()
    sent = 0
    per_tick = max(1, int(rate / 50))
    while sent < tasks:
        n = min(per_tick, tasks - sent)
        send(sent, n)
        sent += n
        time.sleep(max(0.0, started + sent / rate - time.perf_counter()))
    return started


def in_schema(conn: Conn, block: str, schema: str) -> bytes:
    """A bench.sql block with its `{schema}` filled in, as an identifier."""
    return sql.SQL(block).format(schema=sql.Identifier(schema)).as_bytes(conn)


class Claimer(Protocol):
    def claim(self, limit: int) -> Sequence[Any]: ...
    def finish(self, claimed: Sequence[Any]) -> int: ...


class Filler:
    """Tops a bench queue up to a backlog size, numbering tasks uniquely, and
    claims from it as a worker does."""

    def __init__(
        self, conn: Conn, tenants: int = 0, queue: str = QUEUE, priorities: Sequence[int] = (0,)
    ) -> None:
        self.conn, self.tenants, self.queue, self.next_number = conn, tenants, queue, 0
        self.priorities = priorities
        self.replaced: dict[int, int] = {}  # task number -> priority, of the tasks replace() added

    def waiting(self) -> int:
        return ready(self.conn, self.queue)

    def fill(self, target: int) -> None:
        self.add(max(0, target - self.waiting()))
        self.conn.execute(query("bench_analyze_ready"))

    def add(self, count: int) -> None:
        load(
            self.conn,
            make_tasks(count, self.tenants, self.next_number, self.queue, self.priorities),
        )
        self.next_number += count

    def replace(self, claimed: Sequence[Any]) -> None:
        """Adds a task like each claimed one (its tenant and priority), so that
        the queue keeps its mix: claims take a tenant's urgent tasks first,
        and tasks added in the plain turn would leave a small queue with
        almost none, where a large one keeps its own for thousands of claims."""
        now = datetime.now(UTC)
        first, self.next_number = self.next_number, self.next_number + len(claimed)
        for number, task in enumerate(claimed, first):
            self.replaced[number] = self._priority(task.args[0])
        load(
            self.conn,
            [
                bench_task(number, self.queue, task.tenant, self.replaced[number], now)
                for number, task in enumerate(claimed, first)
            ],
        )

    def _priority(self, number: int) -> int:
        return self.replaced.get(number, self.priorities[number % len(self.priorities)])

    def claim(self, limit: int) -> Sequence[Any]:
        return db.run(self.conn, core.claim([self.queue], limit, "bench"))

    def finish(self, claimed: Sequence[Any]) -> int:
        return len(db.run(self.conn, core.complete(t.token for t in claimed)))


def _claim_loop(args: tuple[Callable[[Conn], Claimer], str, int, float]) -> tuple[int, float]:
    """Claims and finishes in a loop for `seconds`; the tasks done and the
    CPU seconds the loop took in this process."""
    claimer_of, url, limit, seconds = args
    done = 0
    with db.connect(url, synchronous_commit=False) as conn:  # as workers claim
        # Autocommit: each call is one statement, atomic on its own.
        claimer = claimer_of(conn)
        cpu = time.process_time()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and (got := claimer.claim(limit)):
            done += claimer.finish(got)
        return done, time.process_time() - cpu


def claim_run(
    claimer_of: Callable[[Conn], Claimer],
    url: str,
    connections: int,
    limit: int,
    seconds: float,
    on_start: Callable[[], None] | None = None,
) -> tuple[float, float]:
    """Tasks/s claimed and completed by `connections` processes in `seconds`,
    each with the claimer `claimer_of` makes of its connection (a picklable
    callable: a class, a module's function), and those processes' CPU (µs)
    per task; `on_start` is called once they are up, as the clock starts."""
    with warm_pool(connections) as pool:
        if on_start is not None:
            on_start()
        started = time.perf_counter()
        results = pool.map(_claim_loop, [(claimer_of, url, limit, seconds)] * connections)
        elapsed = time.perf_counter() - started
    done = sum(n for n, _ in results)
    return done / elapsed, sum(cpu for _, cpu in results) * 1e6 / max(1, done)


@contextlib.contextmanager
def warm_pool(processes: int, initializer: Callable[[], None] | None = tune_gc) -> Iterator[Pool]:
    """A pool of `processes` spawned processes, every one up before it is
    handed over (no clock runs while they start)."""
    with multiprocessing.get_context("spawn").Pool(processes, initializer=initializer) as pool:
        pool.map(time.sleep, [0.0] * processes)
        yield pool


@contextlib.contextmanager
def stopping(
    processes: Sequence[subprocess.Popen[bytes]],
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Workers or loaders (rota_tools.processes), stopped when the block ends."""
    try:
        yield list(processes)
    finally:
        stop_workers(processes)


@contextlib.contextmanager
def in_background(
    connect: Callable[[], Conn], step: Callable[[Conn], object], every: float = 0.0
) -> Iterator[None]:
    """`step(conn)` in a thread of its own, on a connection of its own, every
    `every` seconds (back to back with 0) while the block runs: a sampler,
    a feeder, a maintenance duty. A step that returns False ends it."""
    stop = threading.Event()

    def run() -> None:
        with connect() as conn:
            while not stop.is_set() and step(conn) is not False:
                stop.wait(every)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def workers(
    settings: Settings, count: int, **options: Any
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` `rota worker` processes of the no-op app (NOOP_APP) on QUEUE,
    with spawn_workers' `options`, stopped when the block ends."""
    with stopping(spawn_workers(NOOP_APP, [QUEUE], count, settings, **options)) as started:
        yield started


def wait_for(
    condition: Callable[[], bool],
    timeout: float,
    *,
    what: str | None = None,
    poll: float = 0.05,
    processes: Sequence[subprocess.Popen[bytes]] = (),
    errors: tuple[type[Exception], ...] = (),
) -> bool:
    """Polls `condition` until it holds: True. Past `timeout`, raises naming
    `what`, or returns False when no `what` is given. An exception of
    `errors` from the condition counts as not yet (a server down), and a
    process of `processes` (those doing the work) that exits raises: a run
    would otherwise wait for ever."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(*errors):
            if condition():
                return True
        for process in processes:
            if process.poll() is not None:
                args = process.args
                command = " ".join(map(str, args)) if isinstance(args, list) else str(args)
                raise RuntimeError(
                    f"benchmark: `{command}` exited with {process.returncode} while waiting"
                )
        if time.monotonic() > deadline:
            if what is None:
                return False
            raise RuntimeError(f"benchmark: waited {timeout:g} s for {what}")
        time.sleep(poll)


def finished(conn: Conn) -> int:
    """Tasks in rota.finished."""
    return int(conn.execute(query("bench_finished_count")).fetchone()[0])  # type: ignore[index]


def wait_for_finished(
    conn: Conn,
    count: int,
    processes: Sequence[subprocess.Popen[bytes]],
    drained: bool = False,
    timeout: float = 3600,
) -> None:
    """Until `count` tasks finished. `drained`: `count` is every task of the
    run, counted only once none waits or runs (bench_finished_when_drained:
    counting a growing table every 50 ms takes a share of the server that
    the run measures)."""
    statement = query("bench_finished_when_drained") if drained else query("bench_finished_count")

    def done() -> bool:
        row = conn.execute(statement).fetchone()
        return row is not None and row[0] is not None and row[0] >= count

    wait_for(done, timeout, what=f"{count} tasks to finish", processes=processes)


def p50_p99(values: Sequence[float], digits: int = 1, suffix: str = "") -> dict[str, float]:
    """The sample's median and 99th percentile, rounded."""
    return {
        f"p50{suffix}": round(statistics.median(values), digits),
        f"p99{suffix}": round(percentile(values, 0.99), digits),
    }


def ratio(a: float, b: float, digits: int = 3) -> float:
    return round(a / b, digits)


def median_costs(costs: Sequence[Mapping[str, float | None]]) -> dict[str, float | None]:
    """Each measure's median over the runs (None if it could not be taken)."""
    medians: dict[str, float | None] = {}
    for key in costs[0] if costs else ():
        values = [value for c in costs if (value := c[key]) is not None]
        medians[key] = round(statistics.median(values), 1) if values else None
    return medians


def phase_medians(batches: Sequence[Mapping[str, int]]) -> dict[str, float]:
    """Each phase's median over micro-batches' `durationMs` (a phase a batch
    did not report counts as 0 there)."""
    names = sorted({name for batch in batches for name in batch})
    return {name: statistics.median(b.get(name, 0) for b in batches) for name in names}
