"""`rota bench cancel`: how long a running task takes to stop once its cancel
is asked (rota.cancel issued to the task's row `cancelled`), for a sync task
that looks at its flag every millisecond, for an async one cancelled at
its await, and for a sync one in the process pool, killed with its process;
each run by an idle worker process."""

from __future__ import annotations

import functools
import time
from typing import Any
from uuid import UUID

import psycopg

from rota import Settings, core
from rota.core import db
from rota.model.envelope import make_envelope
from rota_tools.bench.harness import QUEUE, p50_p99, reset, wait_for, workers
from rota_tools.sql import query


def _running(conn: psycopg.Connection[Any], task_id: UUID) -> bool:
    return conn.execute(query("bench_is_running"), {"id": task_id}).fetchone() is not None


def _cancelled(conn: psycopg.Connection[Any], task_id: UUID) -> bool:
    return db.run(conn, core.task_states([task_id]))[task_id].status == "cancelled"


def _latencies(conn: psycopg.Connection[Any], name: str, runs: int) -> list[float]:
    latencies = []
    for _ in range(runs):
        envelope = make_envelope(name=name, queue=QUEUE, tenant="t", args=[60])
        db.transact(conn, core.load([envelope]))
        wait_for(
            functools.partial(_running, conn, envelope.id), 30, what=f"{name} to start", poll=0.001
        )
        time.sleep(0.05)  # well into its run
        asked = time.perf_counter()
        db.transact(conn, core.cancel([envelope.id], "bench"))
        wait_for(
            functools.partial(_cancelled, conn, envelope.id),
            30,
            what=f"{name}'s cancel",
            poll=0.001,
        )
        latencies.append((time.perf_counter() - asked) * 1000)
    return latencies


def bench_cancel(settings: Settings, runs: int) -> dict[str, Any]:
    figures: dict[str, Any] = {"params": {"runs": runs}}
    with db.connect(settings.database_url) as conn:
        for pool, kinds in (
            ("threads", (("sync_cooperative", "spin"), ("async", "async_spin"))),
            ("processes", (("process_pool_killed", "spin"),)),
        ):
            reset(conn)
            with workers(settings, 1, concurrency=4, batch_size=10, pool=pool):
                for key, name in kinds:
                    figures[key] = {"cancel_to_cancelled_ms": p50_p99(_latencies(conn, name, runs))}
    figures["goal"] = {"p50_ms_at_most": 1000}
    return figures
