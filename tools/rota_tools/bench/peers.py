"""Peers on the same machine and PostgreSQL: pgqueuer's and procrastinate's
no-op throughput.

Both are installed from PyPI (`pip install 'rota[bench]'`). Their workers drain
no-op jobs in 1 and 2 processes, each peer in a database of its own on the
same server: pgqueuer with the same claim batch, procrastinate with the same
concurrency.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import psycopg

from rota_tools.bench.harness import fresh_database, warm_pool

DATABASE = "rota_peer_pgqueuer"


async def _prepare(url: str, tasks: int) -> None:
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
        await queries.install()
        for i in range(0, tasks, 10_000):
            n = min(10_000, tasks - i)
            await queries.enqueue(["noop"] * n, [b"1"] * n, [0] * n)


async def _drain(url: str, batch_size: int) -> int:
    from pgqueuer import PgQueuer
    from pgqueuer.domain.types import QueueExecutionMode

    done = 0
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        pgq = PgQueuer.from_psycopg_connection(conn)

        @pgq.entrypoint("noop")
        async def noop(job: Any) -> None:
            nonlocal done
            done += 1

        await pgq.run(
            batch_size=batch_size,
            mode=QueueExecutionMode.drain,
            dequeue_timeout=timedelta(seconds=1),
        )
    return done


def _worker(args: tuple[str, int]) -> int:
    return asyncio.run(_drain(*args))


def pgqueuer_throughput(url: str, tasks: int, processes: int, batch_size: int) -> float:
    peer = fresh_database(url, DATABASE)
    asyncio.run(_prepare(peer, tasks))
    with warm_pool(processes, initializer=None) as pool:  # up before the clock starts
        started = time.perf_counter()
        done = sum(pool.map(_worker, [(peer, batch_size)] * processes))
        elapsed = time.perf_counter() - started
    return done / elapsed


PROCRASTINATE_DATABASE = "rota_peer_procrastinate"


def _procrastinate_app(url: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop", queue="bench")
    async def noop(i: int) -> None:
        return None

    return app


async def _procrastinate_prepare(url: str, tasks: int) -> None:
    app = _procrastinate_app(url)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        noop = app.tasks["noop"]
        for i in range(0, tasks, 5_000):
            await noop.batch_defer_async(*({"i": j} for j in range(i, min(tasks, i + 5_000))))


async def _procrastinate_drain(url: str, concurrency: int) -> None:
    app = _procrastinate_app(url)
    async with app.open_async():
        await app.run_worker_async(
            queues=["bench"],
            concurrency=concurrency,
            wait=False,
            install_signal_handlers=False,
            delete_jobs="always",
        )


def _procrastinate_worker(args: tuple[str, int]) -> None:
    asyncio.run(_procrastinate_drain(*args))


def procrastinate_throughput(url: str, tasks: int, processes: int, concurrency: int) -> float:
    peer = fresh_database(url, PROCRASTINATE_DATABASE)
    asyncio.run(_procrastinate_prepare(peer, tasks))
    with warm_pool(processes, initializer=None) as pool:
        started = time.perf_counter()
        pool.map(_procrastinate_worker, [(peer, concurrency)] * processes)
        elapsed = time.perf_counter() - started
    return tasks / elapsed
