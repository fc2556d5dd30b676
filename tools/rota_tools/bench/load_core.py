"""`rota bench load --engine core`: the fair bulk load against a raw COPY of
the same rows and against the ceiling of any fair design, and with
`--connections N` one queue loaded by N processes at once."""

from __future__ import annotations

import itertools
import multiprocessing
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg

from rota import core
from rota.core import db
from rota.core.copyrows import TASK_COPY_TYPES_LEAN, keeps_defaults
from rota.core.db import Copy, Op, Row
from rota.core.load import columns_of
from rota.model.envelope import TaskEnvelope
from rota.runtime.process import tune_gc
from rota_tools.bench.cpu import CpuMeter, PostgresCost, median_run, postgres_probe
from rota_tools.bench.harness import (
    BATCH,
    QUEUE,
    Conn,
    bench_task,
    in_background,
    make_tasks,
    median_costs,
    ratio,
    reset,
)
from rota_tools.sql import query

LOAD_APPLICATION = "rota-bench-load"  # the parallel loaders' backends, for the sampler


def _load_batches(conn: Conn, batches: list[list[TaskEnvelope]]) -> float:
    started = time.perf_counter()
    for batch in batches:
        db.transact(conn, core.load(batch))
    return time.perf_counter() - started


def _copy_only(step: Copy) -> Op[None]:
    yield step


def _raw_copy(conn: Conn, batches: list[list[TaskEnvelope]], fair_index: bool = False) -> float:
    """Baseline: COPY the rows the fair load COPYs into rota.tasks into a table
    shaped like it, primary key only, in the same binary format. With
    `fair_index`, each row also carries its place in line (block method: a
    tenant's nth task at n), kept in a fair-order index: the ceiling of any
    fair design, as it does no lookups, no locking and no second write."""
    conn.execute(query("bench_indexed_setup") if fair_index else query("bench_raw_setup"))
    queue_ids: defaultdict[str, int] = defaultdict(lambda: 1)
    tenant_ids: defaultdict[str, int] = defaultdict(lambda: len(tenant_ids) + 1)
    places: defaultdict[str, int] = defaultdict(int)

    def placed(rows: Iterator[tuple[Any, ...]], batch: list[TaskEnvelope]) -> Iterator[Row]:
        for row, task in zip(rows, batch, strict=True):
            places[task.tenant] += 1
            yield (*row, float(places[task.tenant]))

    now = datetime.now(UTC)
    started = time.perf_counter()
    seq = itertools.count()
    for batch in batches:
        # The columns the fair load COPYs for these rows.
        lean = keeps_defaults(columns_of(batch))
        numbered = zip(seq, batch, strict=False)
        rows = core.task_rows(numbered, queue_ids, tenant_ids, now, lean=lean)
        columns = TASK_COPY_TYPES_LEAN if lean else core.TASK_COPY_TYPES
        if fair_index:
            indexed = query("bench_indexed_copy_lean") if lean else query("bench_indexed_copy")
            copy = Copy(indexed, placed(rows, batch), (*columns, "float8"))
        else:
            raw = query("bench_raw_copy_lean") if lean else query("bench_raw_copy")
            copy = Copy(raw, rows, columns)
        db.transact(conn, _copy_only(copy))
    return time.perf_counter() - started


def bench_load(url: str, tasks: int, tenants: int, runs: int) -> dict[str, Any]:
    """Fair bulk load vs raw COPY of the same rows, and vs the ceiling of any
    fair design (one COPY into a table with a fair-order index), alternating,
    `runs` times."""
    raw_rates, indexed_rates, fair_rates = [], [], []
    costs: list[dict[str, float | None]] = []
    cpu: list[dict[str, Any]] = []
    statements: list[dict[str, Any]] | None = None  # the last run's, with pg_stat_statements
    with psycopg.connect(url, autocommit=True) as conn:
        for run in range(runs):
            rows = list(make_tasks(tasks, tenants, start=run * tasks))
            batches = [rows[i : i + BATCH] for i in range(0, len(rows), BATCH)]
            reset(conn)
            raw_rates.append(tasks / _raw_copy(conn, batches))
            reset(conn)  # drops the raw table too
            indexed_rates.append(tasks / _raw_copy(conn, batches, fair_index=True))
            reset(conn)
            cost = PostgresCost(conn)
            meter = CpuMeter({"postgresql": postgres_probe(conn)})
            meter.start()
            loader = time.process_time()  # this process loads
            seconds = _load_batches(conn, batches)
            fair_rates.append(tasks / seconds)
            cpu.append(meter.report(seconds, tasks, {"loader": time.process_time() - loader}))
            costs.append(cost.per_task(tasks))
            statements = cost.top_statements(tasks)
    raw, indexed, fair = (
        statistics.median(rates) for rates in (raw_rates, indexed_rates, fair_rates)
    )
    return {
        "params": {"tasks": tasks, "tenants": tenants, "batch": BATCH, "runs": runs},
        "raw_copy_rows_per_s": round(raw),
        "fair_load_tasks_per_s": round(fair),
        "fair_to_raw_ratio": ratio(fair, raw),
        # No fair design that keeps a claim index can beat this ratio.
        "fair_index_copy_rows_per_s": round(indexed),
        "fair_index_copy_to_raw_ratio": ratio(indexed, raw),
        "postgresql_per_task": median_costs(costs),
        # The fair load's CPU by process (the median run's): this process
        # building and sending the loads, and PostgreSQL.
        "cpu": median_run(cpu),
        **({"postgresql_statements": statements} if statements else {}),
        "runs": {
            "raw_copy": [round(r) for r in raw_rates],
            "fair_index_copy": [round(r) for r in indexed_rates],
            "fair_load": [round(r) for r in fair_rates],
        },
        "goal": {"fair_to_raw_ratio_at_least": 0.8},
    }


def _tenant_batches(tasks: int, tenants: int, part: int, parts: int) -> list[list[TaskEnvelope]]:
    """Loader `part`'s share of `tasks` (of `tenants` tenants, evenly spread)
    in batches: the tenants whose number is `part` modulo `parts`, so that no
    two loaders share a tenant."""
    now = datetime.now(UTC)
    mine = [
        bench_task(i, QUEUE, f"t{i % tenants:04d}", 0, now)
        for i in range(tasks)
        if (i % tenants) % parts == part
    ]
    return [mine[i : i + BATCH] for i in range(0, len(mine), BATCH)]


def _parallel_loader(
    url: str, tasks: int, tenants: int, part: int, parts: int, ready: Any, results: Any
) -> None:
    """A loading process: its batches made before the start (not timed),
    then loaded one transaction each; puts its end time (time.time)."""
    tune_gc()
    batches = _tenant_batches(tasks, tenants, part, parts)
    with psycopg.connect(url, autocommit=True, application_name=LOAD_APPLICATION) as conn:
        ready.wait()
        _load_batches(conn, batches)
    results.put(time.time())


class _Waits:
    """What the loaders' backends wait on (pg_stat_activity), sampled by
    `sample` every few milliseconds from a connection of its own."""

    def __init__(self) -> None:
        self.samples = 0  # backend samples taken while loading
        self.waits: defaultdict[str, int] = defaultdict(int)  # "type:event" -> samples

    def sample(self, conn: Conn) -> None:
        rows = conn.execute(query("bench_load_waits"), {"application": LOAD_APPLICATION})
        for _pid, kind, event in rows:
            if kind == "Client" and event == "ClientRead":
                continue  # idle between statements: the client's time
            self.samples += 1
            if kind:
                self.waits[f"{kind}:{event}"] += 1

    @property
    def lock_waits(self) -> int:
        return sum(n for key, n in self.waits.items() if key.startswith("Lock:"))


def _timed_parallel_load(url: str, tasks: int, tenants: int, parts: int) -> tuple[float, _Waits]:
    """Loads `tasks` from `parts` processes at once, each its own tenants;
    the seconds from their common start to the last one's end, and what
    their backends waited on meanwhile."""
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Barrier(parts + 1), ctx.Queue()
    workers = [
        ctx.Process(
            target=_parallel_loader, args=(url, tasks, tenants, part, parts, ready, results)
        )
        for part in range(parts)
    ]
    for worker in workers:
        worker.start()
    sampler = _Waits()
    with in_background(lambda: psycopg.connect(url, autocommit=True), sampler.sample, 0.005):
        ready.wait()
        started = time.time()
        ends = [results.get(timeout=3600) for _ in workers]
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise RuntimeError(f"a loading process failed (exit code {worker.exitcode})")
    return max(ends) - started, sampler


def bench_parallel_load(
    url: str, tasks: int, tenants: int, connections: int, runs: int
) -> dict[str, Any]:
    """One queue loaded by `connections` processes at once, each with its
    own tenants, against the same batches loaded by one process, alternating,
    `runs` times; with the lock waits sampled among the loaders' backends."""
    one_rates, many_rates, lock_waits, samples = [], [], [], []
    waits: defaultdict[str, int] = defaultdict(int)
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(runs):
            # The queue exists before the loads start: the first load of a
            # queue creates its row, and loads racing it wait for that, once.
            reset(conn)
            conn.execute(query("bench_shard_queue"), {"queue": QUEUE})
            seconds, _sampler = _timed_parallel_load(url, tasks, tenants, 1)
            one_rates.append(tasks / seconds)
            reset(conn)
            conn.execute(query("bench_shard_queue"), {"queue": QUEUE})
            seconds, sampler = _timed_parallel_load(url, tasks, tenants, connections)
            many_rates.append(tasks / seconds)
            lock_waits.append(sampler.lock_waits)
            samples.append(sampler.samples)
            for key, count in sampler.waits.items():
                waits[key] += count
    one, many = statistics.median(one_rates), statistics.median(many_rates)
    return {
        "params": {"tasks": tasks, "tenants": tenants, "connections": connections, "runs": runs},
        "one_connection_tasks_per_s": round(one),
        "tasks_per_s": round(many),
        "ratio_to_one": ratio(many, one),
        # Samples of the loaders' backends (not idle between statements), and
        # those waiting on a heavyweight lock: loads of disjoint tenants take none.
        "backend_samples": sum(samples),
        "lock_wait_samples": sum(lock_waits),
        # Of those, waits on rows (a tag, a task) or on another transaction:
        # the locks loads of one tenant take turns on. `Lock:extend` (two
        # writers growing one table) and `Lock:object` (NOTIFY's commit
        # queue) are PostgreSQL's own, met by any two writers of a table.
        "row_lock_wait_samples": sum(
            n for key, n in waits.items() if key in ("Lock:tuple", "Lock:transactionid")
        ),
        "waits": dict(sorted(waits.items(), key=lambda kv: -kv[1])),
        "runs": {
            "one_connection": [round(r) for r in one_rates],
            "connections": [round(r) for r in many_rates],
            "ratios": [round(m / o, 3) for o, m in zip(one_rates, many_rates, strict=True)],
        },
        "goal": {"ratio_to_one_at_least": 1.3, "lock_wait_samples": 0},
    }
