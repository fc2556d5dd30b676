"""Enqueue -> start at the pace `rota bench end-to-end` offers, through
designs simpler than rota's, on the same servers: the floors its starts are
read against (docs/explanation/benchmarks.md, "Scenarios"). Redis alone (a
pop, no durable store, no lease); a durable PostgreSQL queue written to
directly (a tick's tasks and the NOTIFY in one statement, a consumer on
LISTEN that claims 100 with a lease), also flooded as rota's pipeline is
(every task, the same rate, two consumers) with the CPU of every process;
and pgqueuer. Each consumer is a process of its own; a task starts when its
consumer holds it (rota's: when its claim returns).
"""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from rota import Settings
from rota.buffer import redis_client
from rota.consumer.running import TaskPool
from rota_tools.bench.cpu import CpuMeter, pid_probe, postgres_probe
from rota_tools.bench.harness import fresh_database, in_schema, offer, p50_p99, wait_for
from rota_tools.sql import query

POP_KEY = "rota-bench-pop"  # the Redis pop baseline's list
PGQUEUE_SCHEMA = "rota_bench_pgqueue"
PGQUEUER_DATABASE = "rota_peer_pgqueuer_starts"
BATCH = 100  # each consumer's claim, as rota's workers' in end-to-end
IDLE_SECONDS = 5.0  # a consumer that waited this long for work gives up
# The flooded queue's variants, each the plain one plus one thing every rota
# task has: "kept", completion keeps a record of the task (rota.finished);
# "threads", the consumer runs each task's function on a pool of THREADS
# threads and completes it once it returned (a worker's sync tasks).
FLOORS = ("plain", "kept", "threads")
THREADS = 8  # as rota's workers' concurrency in end-to-end


def start_baselines(settings: Settings, tasks: int, rate: float) -> dict[str, Any]:
    """The three floors, each with `tasks` at `rate`, for end-to-end's report."""
    figures: dict[str, Any] = {
        "redis_pop_baseline": redis_pop_baseline(settings, tasks, rate),
        "postgres_queue_baseline": postgres_queue_baseline(settings, tasks, rate),
    }
    if importlib.util.find_spec("pgqueuer") is not None:
        figures["pgqueuer_baseline"] = pgqueuer_baseline(settings, tasks, rate)
    else:
        figures["pgqueuer_baseline"] = "not installed (pip install 'rota[bench]')"
    return figures


def redis_pop_baseline(settings: Settings, tasks: int, rate: float) -> dict[str, Any]:
    """Redis alone: the producer pushes each tick's tasks onto a list in one
    command; the consumer pops up to BATCH at a time (BLMPOP)."""
    client = redis_client.connect(settings)
    client.delete(POP_KEY)
    try:
        return _paced(
            "Redis pop",
            _pop_consumer,
            settings,
            tasks,
            rate,
            lambda first, n: client.rpush(
                POP_KEY,
                *(
                    json.dumps({"args": [i, "pad"], "enqueued_at": time.time()})
                    for i in range(first, first + n)
                ),
            ),
        )
    finally:
        client.delete(POP_KEY)
        client.close()


def postgres_queue_baseline(
    settings: Settings, tasks: int, rate: float, consumers: int = 1, floor: str = "plain"
) -> dict[str, Any]:
    """The durable PostgreSQL queue written to directly (see the module's
    docstring), in a schema of its own on rota's database. With more
    `consumers` (the flood), the report has the tasks/s achieved (from the
    first task sent to the last one started) and the CPU a task of the
    producer (this process), the consumers and PostgreSQL. `floor` (one of
    FLOORS) adds to it one thing every rota task has."""
    if floor not in FLOORS:
        raise ValueError(f"floor {floor!r}: one of {', '.join(FLOORS)}")
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(_render(conn, query("bench_fifo_schema")))
        conn.execute(_render(conn, query("bench_pgqueue_setup")))
        if floor == "kept":
            conn.execute(_render(conn, query("bench_pgqueue_kept_setup")))
        enqueue = _render(conn, query("bench_pgqueue_enqueue"))

        def send(first: int, n: int) -> None:
            enqueued_at = time.time()
            payloads = [json.dumps({"args": [i, "pad"]}) for i in range(first, first + n)]
            conn.execute(enqueue, {"payloads": payloads, "enqueued_at": enqueued_at}, prepare=True)

        def meter(pids: list[int]) -> CpuMeter:
            return CpuMeter(
                {
                    "producer": pid_probe(os.getpid()),
                    **{f"consumer_{n}": pid_probe(pid) for n, pid in enumerate(pids, 1)},
                    "postgresql": postgres_probe(conn),
                }
            )

        try:
            figures = _paced(
                "PostgreSQL queue",
                _pgqueue_consumer,
                (settings.database_url, floor),
                tasks,
                rate,
                send,
                consumers,
                meter if consumers > 1 else None,
            )
            figures["left"] = _count(conn, query("bench_pgqueue_left"))
            if floor == "kept":
                figures["records_kept"] = _count(conn, query("bench_pgqueue_kept_count"))
            return figures
        finally:
            conn.execute(_render(conn, query("bench_fifo_drop_schema")))


def pgqueuer_baseline(settings: Settings, tasks: int, rate: float) -> dict[str, Any]:
    """pgqueuer in a database of its own on the same server: its producer's
    enqueue (an INSERT that NOTIFYs), its worker with a claim batch of BATCH."""
    from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
    from pgqueuer.queries import SyncQueries

    url = fresh_database(settings.database_url, PGQUEUER_DATABASE)
    asyncio.run(_install_pgqueuer(url))
    with psycopg.connect(url, autocommit=True) as conn:
        queries = SyncQueries(SyncPsycopgDriver(conn))

        def send(first: int, n: int) -> None:
            enqueued_at = time.time()
            payloads: list[bytes | None] = [
                json.dumps({"args": [i, "pad"], "enqueued_at": enqueued_at}).encode()
                for i in range(first, first + n)
            ]
            queries.enqueue(["noop"] * n, payloads, [0] * n)

        return _paced("pgqueuer", _pgqueuer_consumer, url, tasks, rate, send)


def _paced(
    what: str,
    consumer: Callable[..., None],
    target: Any,
    tasks: int,
    rate: float,
    send: Callable[[int, int], object],
    consumers: int = 1,
    meter: Callable[[list[int]], CpuMeter] | None = None,
) -> dict[str, Any]:
    """Starts `consumer(target, tasks, results)` in a process of its own,
    offers `tasks` at `rate` through `send` once it says it is waiting, and
    reports the starts it sends back. With more `consumers`, each is also
    given the count of tasks they started between them (a shared counter:
    each stops once it reaches `tasks`), and the report has the tasks/s
    achieved and, with a `meter` of the consumers' pids, the CPU used."""
    ctx = multiprocessing.get_context("spawn")
    started_count = ctx.Value("q", 0)
    pipes, processes = [], []
    for _ in range(consumers):
        receiving, sending = ctx.Pipe(duplex=False)
        args = (target, tasks, sending) + ((started_count,) if consumers > 1 else ())
        processes.append(ctx.Process(target=consumer, args=args, daemon=True))
        pipes.append(receiving)
        processes[-1].start()
        sending.close()
    figures: dict[str, Any] = {"tasks": tasks}
    try:
        for receiving, process in zip(pipes, processes, strict=True):
            _receive(receiving, process, 60, f"the {what} consumer did not start")  # waiting
        cpu = meter([p.pid for p in processes if p.pid is not None]) if meter else None
        if cpu:
            cpu.start()
        began = offer(tasks, rate, send)
        if consumers > 1:
            wait_for(
                lambda: started_count.value >= tasks or not all(p.is_alive() for p in processes),
                3600,
                poll=0.002,
            )
            elapsed = time.perf_counter() - began
            figures["tasks_per_s"] = round(tasks / elapsed)
            if cpu:
                figures["cpu"] = cpu.report(elapsed, tasks)
        starts: list[float] = []
        for receiving, process in zip(pipes, processes, strict=True):
            starts += _receive(receiving, process, 120, f"the {what} consumer did not finish")
        if len(starts) < tasks:
            raise RuntimeError(f"benchmark: the {what} consumers got {len(starts)} of {tasks}")
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
    return {**figures, "enqueue_to_start_ms": p50_p99(starts)}


def _receive(receiving: Any, process: Any, timeout: float, failure: str) -> Any:
    def arrived() -> bool:
        if receiving.poll(0.5):
            return True
        if not process.is_alive() and not receiving.poll(0):
            raise RuntimeError(f"benchmark: {failure} (exit code {process.exitcode})")
        return False

    wait_for(arrived, timeout, what=failure, poll=0)
    return receiving.recv()


def _render(conn: psycopg.Connection[Any], block: str) -> bytes:
    return in_schema(conn, block, PGQUEUE_SCHEMA)


def _count(conn: psycopg.Connection[Any], block: str) -> int:
    row = conn.execute(_render(conn, block)).fetchone()
    return int(row[0]) if row else 0


def _pop_consumer(settings: Settings, tasks: int, results: Any) -> None:
    client = redis_client.connect(settings, timeout=10)
    client.ping()
    results.send(None)
    starts: list[float] = []
    while len(starts) < tasks:
        popped = client.blmpop(IDLE_SECONDS, 1, POP_KEY, direction="LEFT", count=BATCH)
        now = time.time()
        if popped is None:
            break  # the parent reports the shortfall
        items: list[bytes] = popped[1]  # type: ignore[assignment]  # [key, [items]]
        starts.extend((now - json.loads(item)["enqueued_at"]) * 1000 for item in items)
    results.send(starts)
    client.close()


def _pgqueue_consumer(
    target: tuple[str, str], tasks: int, results: Any, shared: Any = None
) -> None:
    """Claims and completes until `tasks` started: its own, or with `shared`
    (a counter of all consumers' starts), everyone's. `target`: the URL and
    the floor (FLOORS)."""
    url, floor = target
    starts: list[float] = []
    pool = _Runner(THREADS) if floor == "threads" else None
    with psycopg.connect(url, autocommit=True) as conn:
        finishing = (
            query("bench_pgqueue_finish_kept") if floor == "kept" else query("bench_pgqueue_finish")
        )
        claim, finish = _render(conn, query("bench_pgqueue_claim")), _render(conn, finishing)
        conn.execute(query("bench_pgqueue_listen"))
        results.send(None)
        idle_since = time.monotonic()
        while (shared.value if shared is not None else len(starts)) < tasks:
            limit = BATCH
            if pool is not None:
                # At most a batch beyond the running ones, claimed once half
                # a batch is free, as a worker does.
                while True:
                    if ids := pool.done():
                        conn.execute(finish, {"ids": ids}, prepare=True)
                    if (limit := min(BATCH, THREADS + BATCH - pool.running)) >= BATCH // 2:
                        break
                    pool.wait()
            rows = conn.execute(claim, {"limit": limit}, prepare=True).fetchall()
            now = time.time()
            if rows:
                starts.extend((now - enqueued_at) * 1000 for _, _, enqueued_at in rows)
                if shared is not None:
                    with shared.get_lock():
                        shared.value += len(rows)
                if pool is None:
                    conn.execute(finish, {"ids": [row[0] for row in rows]}, prepare=True)
                else:
                    pool.run(rows)
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_SECONDS:
                break  # the parent reports the shortfall
            else:
                # Briefly: another consumer may take the last tasks.
                list(conn.notifies(timeout=0.05, stop_after=1))
        while pool is not None and pool.running:
            pool.wait()
            if ids := pool.done():
                conn.execute(finish, {"ids": ids}, prepare=True)
    results.send(starts)


def _noop(*args: Any) -> None:
    """The task the "threads" floor runs (the bench app's noop)."""


class _Runner:
    """A worker's pool of threads (rota's TaskPool) calling each claimed
    row's function with its payload's args, in claim order; the ids of
    those returned are collected for the completion."""

    def __init__(self, size: int) -> None:
        self._pool = TaskPool(size, "floor")
        self._done: collections.deque[int] = collections.deque()
        self._returned = threading.Event()
        self.running = 0

    def run(self, rows: list[tuple[int, dict[str, Any], float]]) -> None:
        self.running += len(rows)
        for task_id, payload, _ in rows:
            self._pool.submit(self._call, task_id, payload)

    def _call(self, task_id: int, payload: dict[str, Any]) -> None:
        _noop(*payload["args"])
        self._done.append(task_id)
        self._returned.set()

    def wait(self) -> None:
        """Until a call returned since the last `done()`."""
        if not self._done:
            self._returned.wait(1.0)
        self._returned.clear()

    def done(self) -> list[int]:
        ids = []
        while self._done:
            ids.append(self._done.popleft())
        self.running -= len(ids)
        return ids


async def _install_pgqueuer(url: str) -> None:
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await Queries(PsycopgDriver(conn)).install()


def _pgqueuer_consumer(url: str, tasks: int, results: Any) -> None:
    asyncio.run(_pgqueuer_starts(url, tasks, results))


async def _pgqueuer_starts(url: str, tasks: int, results: Any) -> None:
    from pgqueuer import PgQueuer

    starts: list[float] = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        pgq = PgQueuer.from_psycopg_connection(conn)

        @pgq.entrypoint("noop")
        async def noop(job: Any) -> None:
            starts.append((time.time() - json.loads(job.payload)["enqueued_at"]) * 1000)
            if len(starts) >= tasks:
                pgq.shutdown.set()

        async def give_up_when_idle() -> None:
            seen = -1
            while len(starts) != seen:  # the parent reports the shortfall
                seen = len(starts)
                await asyncio.sleep(IDLE_SECONDS)
            pgq.shutdown.set()

        results.send(None)
        watchdog = asyncio.create_task(give_up_when_idle())
        await pgq.run(batch_size=BATCH, dequeue_timeout=timedelta(seconds=1))
        watchdog.cancel()
    results.send(starts)
