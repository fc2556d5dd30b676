"""Peers on the same machine and PostgreSQL: pgqueuer's no-op throughput.

pgqueuer is installed from PyPI (`pip install 'rota[bench]'`). Its workers
drain the same number of no-op jobs with the same claim batch, in 1 and 2
processes, in a database of its own on the same server.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

DATABASE = "rota_peer_pgqueuer"


def _peer_url(url: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + DATABASE


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
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DATABASE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    peer = _peer_url(url)
    asyncio.run(_prepare(peer, tasks))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes) as pool:
        pool.map(time.sleep, [0.0] * processes)  # processes up before the clock starts
        started = time.perf_counter()
        done = sum(pool.map(_worker, [(peer, batch_size)] * processes))
        elapsed = time.perf_counter() - started
    return done / elapsed
