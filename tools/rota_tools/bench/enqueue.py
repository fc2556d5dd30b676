"""`rota bench enqueue`: the producer into the buffer, beside plain
pipelined XADDs of the same envelopes; single enqueues; and the fallback
into PostgreSQL with Redis down."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from rota import App, Settings
from rota.buffer import redis_client
from rota.core import db
from rota_tools.bench.cpu import CpuMeter, median_run, pid_probe, redis_probe
from rota_tools.bench.harness import (
    BATCH,
    PAD,
    bench_app,
    flush_buffer,
    p50_p99,
    ratio,
    reset,
    skewed_tenant,
)

PIPELINE = 500  # XADDs a round trip, of the plain baseline


def _enqueue_many(
    app: App, settings: Settings, tasks: int, tenants: int
) -> tuple[float, dict[str, Any]]:
    """Tasks/s of `enqueue_many` (BATCH a call) into an empty buffer, and
    the CPU of this process (the producer) and of Redis meanwhile."""
    noop = app.tasks["noop"]
    calls = [noop.using(tenant=skewed_tenant(i, tenants)).prepare(i, PAD) for i in range(tasks)]
    flush_buffer(settings)
    client = redis_client.connect(settings)
    meter = CpuMeter({"producer": pid_probe(os.getpid()), "redis": redis_probe(client)})
    meter.start()
    started = time.perf_counter()
    for i in range(0, tasks, BATCH):
        app.enqueue_many(calls[i : i + BATCH])
    elapsed = time.perf_counter() - started
    cpu = meter.report(elapsed, tasks)
    client.close()
    return tasks / elapsed, cpu


def _plain_pipelining(app: App, settings: Settings, tasks: int, tenants: int) -> float:
    """Baseline: plain redis-py pipelining, one XADD per task in PIPELINEs,
    of the same (already built) envelopes: no validation, no batching."""
    noop = app.tasks["noop"]
    calls = [noop.using(tenant=skewed_tenant(i, tenants)).prepare(i, PAD) for i in range(tasks)]
    messages = [e.to_json() for e in app.batch(calls).envelopes()]
    flush_buffer(settings)
    client = redis_client.connect(settings)
    started = time.perf_counter()
    for i in range(0, tasks, PIPELINE):
        pipe = client.pipeline(transaction=False)
        for j, message in enumerate(messages[i : i + PIPELINE]):
            pipe.xadd(f"{settings.stream_prefix}:{{{(i + j) % settings.shards}}}", {b"e": message})
        pipe.execute()
    elapsed = time.perf_counter() - started
    client.close()
    return tasks / elapsed


def _single_ms(app: App, tenant: Any, count: int, pad: str) -> list[float]:
    """Milliseconds of each of `count` single enqueues (`tenant(i)`'s)."""
    noop, times = app.tasks["noop"], []
    for i in range(count):
        started = time.perf_counter()
        noop.using(tenant=tenant(i)).enqueue(i, pad)
        times.append((time.perf_counter() - started) * 1000)
    return times


def _fallback(settings: Settings, tenants: int) -> tuple[float, list[float]]:
    """With Redis unreachable, enqueues go to PostgreSQL: `enqueue_many`'s
    tasks/s and single enqueues' milliseconds."""
    down = bench_app(
        settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0", "redis_retries": 0})
    )
    noop = down.tasks["noop"]
    with db.connect(settings.database_url) as conn:
        reset(conn)
    calls = [noop.using(tenant=skewed_tenant(i, tenants)).prepare(i, "pad") for i in range(20_000)]
    started = time.perf_counter()
    for i in range(0, len(calls), 5_000):
        down.enqueue_many(calls[i : i + 5_000])
    rate = len(calls) / (time.perf_counter() - started)
    single = _single_ms(down, lambda i: "single", 200, "pad")
    down.close()
    return rate, single


def bench_enqueue(settings: Settings, tasks: int, tenants: int, runs: int) -> dict[str, Any]:
    app = bench_app(settings)
    many, plain, cpu = [], [], []
    for _ in range(runs):
        rate, used = _enqueue_many(app, settings, tasks, tenants)
        many.append(rate)
        cpu.append(used)
        plain.append(_plain_pipelining(app, settings, tasks, tenants))
    flush_buffer(settings)
    single = _single_ms(app, lambda i: skewed_tenant(i, tenants), 2000, PAD)
    flush_buffer(settings)
    app.close()
    fallback, fallback_single = _fallback(settings, tenants)
    return {
        "params": {"tasks": tasks, "tenants": tenants, "runs": runs, "shards": settings.shards},
        "enqueue_many_tasks_per_s": round(statistics.median(many)),
        "plain_pipelined_xadd_tasks_per_s": round(statistics.median(plain)),
        "ratio_to_plain_pipelining": ratio(statistics.median(many), statistics.median(plain)),
        "single_enqueue_ms": p50_p99(single, 3),
        "fallback_enqueue_many_tasks_per_s": round(fallback),
        "fallback_single_enqueue_ms": p50_p99(fallback_single, 3),
        # `enqueue_many`'s CPU by process (the median run's).
        "cpu": median_run(cpu),
        "runs": {"enqueue_many": [round(r) for r in many], "plain": [round(r) for r in plain]},
        "goal": {"enqueue_many_tasks_per_s_at_least": 100_000, "single_p99_ms_at_most": 1.0},
    }
