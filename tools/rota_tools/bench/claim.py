"""`rota bench claim`, `backlog-scaling` and `lock-pressure`: claims and
completions against the plain SKIP LOCKED queues they are read beside, in
the same runs."""

from __future__ import annotations

import contextlib
import functools
import itertools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg

from rota import core
from rota.core import db
from rota.core.db import UUIDArray
from rota_tools.bench.cpu import PostgresCost
from rota_tools.bench.harness import (
    BATCH,
    QUEUE,
    Claimer,
    Conn,
    Filler,
    claim_run,
    in_background,
    in_schema,
    median_costs,
    p50_p99,
    ratio,
    reset,
    skewed_tenant,
    warm_pool,
)
from rota_tools.sql import query

FIFO = "fifo"  # the baselines' keys among backlog sizes
LEASED_FIFO = "leased_fifo"
ROWS_DIRECT = "rows_direct"  # rota's tables, claimed and completed by plain statements


class FifoFiller:
    """A plain SKIP LOCKED queue that rota's claim is measured against, in a
    schema of its own (`name`):

    - plain: a narrow ready table in arrival order, the body in another
      table; no fairness, limits or leases;
    - with `priorities` (in turn, as Filler's): highest priority first, then
      in arrival order, as the peers order them;
    - `leased`: the plain queue, but a claim records a lease in the body's
      row and completion marks it done there: the least a queue must write
      to give a crashed worker's tasks back."""

    def __init__(
        self,
        conn: Conn,
        name: str,
        priorities: Sequence[int] = (0,),
        leased: bool = False,
    ) -> None:
        self.conn, self.schema, self.leased = conn, f"rota_bench_{name}", leased
        self.priorities = priorities if any(priorities) else None
        if leased:
            setup, claim = query("bench_leased_fifo_setup"), query("bench_leased_fifo_claim")
        elif self.priorities:
            setup, claim = query("bench_priority_fifo_setup"), query("bench_priority_fifo_claim")
        else:
            setup, claim = query("bench_fifo_setup"), query("bench_fifo_claim")
        finish = query("bench_leased_fifo_finish") if leased else query("bench_fifo_finish")
        self.setup, self.claim_query, self.finish_query = map(self._render, (setup, claim, finish))
        self.conn.execute(self._render(query("bench_fifo_schema")))
        self.added = 0  # tasks added in the turn of priorities

    def _render(self, block: str) -> bytes:
        # Rendered once: the timed claims send the same bytes each time.
        return in_schema(self.conn, block, self.schema)

    def fill(self, target: int) -> None:
        self.conn.execute(self.setup)
        self.added = 0
        self.add(target)
        self.conn.execute(self._render(query("bench_analyze_fifo")))

    def add(self, count: int) -> None:
        if self.priorities is None:
            self.conn.execute(self._render(query("bench_fifo_fill")), {"count": count})
            return
        turn = itertools.islice(itertools.cycle(self.priorities), self.added, self.added + count)
        self._add_priorities(list(turn))
        self.added += count

    def _add_priorities(self, priorities: list[int]) -> None:
        fill = self._render(query("bench_priority_fifo_fill"))
        for start in range(0, len(priorities), BATCH):
            self.conn.execute(fill, {"priorities": priorities[start : start + BATCH]})

    def replace(self, claimed: Sequence[Any]) -> None:
        """Adds a task like each claimed one: the queue keeps its mix."""
        if self.priorities is None:
            self.add(len(claimed))
        else:
            self._add_priorities([row[2] for row in claimed])

    def claim(self, limit: int) -> Sequence[Any]:
        return self.conn.execute(self.claim_query, {"limit": limit}, prepare=True).fetchall()

    def finish(self, claimed: Sequence[Any]) -> int:
        ids = UUIDArray(row[0] for row in claimed)
        return self.conn.execute(self.finish_query, {"ids": ids}, prepare=True).rowcount

    def drop(self) -> None:
        self.conn.execute(self._render(query("bench_fifo_drop_schema")))


class RowsDirect:
    """Claims and completes a queue's tasks in rota's own tables by plain
    statements (bench.sql, bench_rows_direct_*): the same row changes as
    rota.claim and rota.complete, none of their logic. Filled by Filler."""

    def __init__(self, conn: Conn, queue: str = QUEUE) -> None:
        self.conn, self.queue = conn, queue
        self.claim_query = query("bench_rows_direct_claim")
        self.finish_query = query("bench_rows_direct_finish")

    def claim(self, limit: int) -> Sequence[Any]:
        params = {"queue": self.queue, "limit": limit}
        return self.conn.execute(self.claim_query, params, prepare=True).fetchall()

    def finish(self, claimed: Sequence[Any]) -> int:
        ids = UUIDArray(row[0] for row in claimed)
        return self.conn.execute(self.finish_query, {"ids": ids}, prepare=True).rowcount


def _latency(times: list[float]) -> dict[str, float]:
    return p50_p99(times, 3, "_ms")


def claimer_of(kind: str) -> Callable[[Conn], Claimer]:
    """The claimer of `kind` ("rota" or a baseline's: FIFO, LEASED_FIFO,
    ROWS_DIRECT), picklable for claim_run's processes."""
    if kind == "rota":
        return Filler
    if kind == ROWS_DIRECT:
        return RowsDirect
    return functools.partial(FifoFiller, name=kind, leased=kind == LEASED_FIFO)


def _queue_for(backlog: int) -> str:
    return f"{QUEUE}-{backlog}"


def _interleaved_claim_latencies(
    fillers: Mapping[str, Filler | FifoFiller], sizes: dict[str, int], samples: int, limit: int
) -> dict[str, list[float]]:
    """Times claims as a worker makes them (statement, rows, commit), of fresh
    tasks, taking turns between the queues (one per backlog size, and the
    baseline's) so that the machine's drift hits every one alike. Claimed
    tasks are finished, and each queue is topped up with tasks like them
    (Filler.replace), untimed, before it falls 5% below its size: every
    queue keeps the mix of tenants and priorities it was filled with, and
    only its depth differs."""
    times: dict[str, list[float]] = {key: [] for key in fillers}
    taken: dict[str, list[Any]] = {key: [] for key in fillers}
    for i in range(samples + 5):
        for key, filler in fillers.items():
            if len(taken[key]) + limit > sizes[key] // 20:
                filler.replace(taken[key])
                taken[key] = []
            started = time.perf_counter()
            got = filler.claim(limit)
            elapsed = time.perf_counter() - started
            assert len(got) == limit, f"claimed {len(got)} of {limit}"
            filler.finish(got)
            taken[key].extend(got)
            if i >= 5:  # the first executions plan and warm up
                times[key].append(elapsed * 1000)
    return times


def _claim_latencies_beside(
    fillers: Mapping[str, Filler],
    sizes: Mapping[str, int],
    baselines: Mapping[str, tuple[FifoFiller, int]],
    samples: int,
    limit: int,
) -> dict[str, list[float]]:
    """Claim latencies of rota's queues and of these baselines (each with
    its size), in the same turns; the baselines are filled first and
    dropped after."""
    try:
        for baseline, size in baselines.values():
            baseline.fill(size)
        queues: dict[str, Filler | FifoFiller] = dict(fillers)
        queues |= {key: baseline for key, (baseline, _) in baselines.items()}
        every = {**sizes, **{key: size for key, (_, size) in baselines.items()}}
        return _interleaved_claim_latencies(queues, every, samples, limit)
    finally:
        for baseline, _ in baselines.values():
            baseline.drop()


def churn(url: str, queue: str, tasks: int, connections: int, limit: int) -> float:
    """Claims and completes `tasks` tasks of `queue` with `connections` processes;
    returns tasks/s."""
    with warm_pool(connections) as pool:
        started = time.perf_counter()
        per = [(url, queue, limit, tasks // connections) for _ in range(connections)]
        done = sum(pool.map(_churn_worker, per))
        elapsed = time.perf_counter() - started
    return done / elapsed


def _churn_worker(args: tuple[str, str, int, int]) -> int:
    url, queue, limit, quota = args
    done = 0
    with db.connect(url, synchronous_commit=False) as conn:  # as workers claim
        claimer = Filler(conn, queue=queue)
        while done < quota and (got := claimer.claim(min(limit, quota - done))):
            done += claimer.finish(got)
    return done


def backlog_scaling(
    url: str,
    backlogs: list[int],
    tenants: int,
    connections: int,
    limit: int,
    samples: int,
    priorities: Sequence[int] = (0,),
) -> dict[str, Any]:
    """Claim latency at each backlog size (one queue each), measured in turns
    with the plain FIFO at the smallest and the largest size (with the same
    priorities), then in turns with the leased FIFO at the largest; then
    again after the largest queue had as many tasks claimed and completed
    (churn: dead tuples for autovacuum)."""
    sizes = sorted(backlogs)
    smallest, largest = str(sizes[0]), str(sizes[-1])
    size_of = {str(size): size for size in sizes}
    small = f"{FIFO}_{smallest}"
    with db.connect(url, synchronous_commit=False) as conn:  # as workers claim
        reset(conn)
        fillers = {
            key: Filler(conn, tenants, _queue_for(n), priorities) for key, n in size_of.items()
        }
        for key, filler in fillers.items():
            filler.fill(size_of[key])
        # The baselines in two sets of turns, each with one large baseline
        # queue beside rota's: the working set each claim competes with is
        # the same in both.
        fifo = {
            FIFO: (FifoFiller(conn, FIFO, priorities), sizes[-1]),
            small: (FifoFiller(conn, small, priorities), sizes[0]),
        }
        before = _claim_latencies_beside(fillers, size_of, fifo, samples, limit)
        leased = {LEASED_FIFO: (FifoFiller(conn, LEASED_FIFO, leased=True), sizes[-1])}
        beside_leased = _claim_latencies_beside(fillers, size_of, leased, samples, limit)
        fillers[largest].fill(2 * sizes[-1])
        churn_rate = churn(url, _queue_for(sizes[-1]), sizes[-1], connections, limit)
        after = _interleaved_claim_latencies(
            {key: fillers[key] for key in (smallest, largest)}, size_of, samples, limit
        )
    latency = {key: _latency(before[key]) for key in size_of}
    latency[f"{largest}_after_churn"] = _latency(after[largest])
    p50 = {key: statistics.median(times) for key, times in before.items()}
    leased_p50 = {key: statistics.median(times) for key, times in beside_leased.items()}
    # Against the smallest queue measured in the same turns after the churn
    # (with one size only, against its own p50 before the churn).
    churned = statistics.median(after[largest])
    small_after = statistics.median(after[smallest] if smallest != largest else before[smallest])
    return {
        "churn_tasks_per_s": round(churn_rate),
        "claim_latency": latency,
        # The plain SKIP LOCKED claim (no fairness, limits or leases) of as many
        # tasks, with the same priorities, timed in the same turns: the
        # baseline of the claim's absolute latency on this machine at this
        # hour, and of its growth with depth.
        "fifo_baseline_claim_latency": {
            largest: _latency(before[FIFO]),
            smallest: _latency(before[small]),
        },
        "p50_ratio_to_fifo_baseline": ratio(p50[largest], p50[FIFO]),
        "fifo_baseline_p50_ratio_largest_to_smallest": ratio(p50[FIFO], p50[small]),
        # The plain FIFO that records leases, timed in turns of its own with
        # rota's queues: the least any queue that gives a crashed worker's
        # tasks back must do.
        "leased_fifo_baseline_claim_latency": {largest: _latency(beside_leased[LEASED_FIFO])},
        "p50_ratio_to_leased_fifo_baseline": ratio(leased_p50[largest], leased_p50[LEASED_FIFO]),
        "p50_ratio_largest_to_smallest": ratio(p50[largest], p50[smallest]),
        "p50_ratio_after_churn_to_smallest": ratio(churned, small_after),
    }


class _Throughput:
    """Claim + complete by `connections` processes for `seconds`, of rota's
    queue and of its baselines (rota's rows written directly, the plain
    FIFO without and with leases), each from a fresh queue of `size`; each
    one's rates and its cost per task on the server and in the claiming
    processes."""

    def __init__(self, conn: Conn, url: str, connections: int, limit: int, seconds: float) -> None:
        self.conn, self.url = conn, url
        self.connections, self.limit, self.seconds = connections, limit, seconds
        kinds = ("rota", ROWS_DIRECT, FIFO, LEASED_FIFO)
        self.rates: dict[str, list[float]] = {kind: [] for kind in kinds}
        self.costs: dict[str, list[dict[str, float | None]]] = {
            kind: [] for kind in kinds if kind != FIFO
        }
        self.statements: list[dict[str, Any]] | None = None  # rota's, with pg_stat_statements

    def run(self, kind: str, tenants: int, size: int, priorities: Sequence[int]) -> None:
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            self.conn.execute(query("bench_checkpoint"))
        if kind in ("rota", ROWS_DIRECT):
            # Fresh tables for each, as the baselines' are: the effect of
            # churn on claims is what backlog-scaling measures.
            reset(self.conn)
            Filler(self.conn, tenants, priorities=priorities).fill(size)
            self._measure(kind)
            return
        baseline = FifoFiller(self.conn, kind, leased=kind == LEASED_FIFO)
        try:
            baseline.fill(size)
            self._measure(kind)
        finally:
            baseline.drop()

    def _measure(self, kind: str) -> None:
        cost = PostgresCost(self.conn)
        rate, client_us = claim_run(
            claimer_of(kind), self.url, self.connections, self.limit, self.seconds
        )
        tasks = max(1, round(rate * self.seconds))
        self.rates[kind].append(rate)
        if kind in self.costs:
            self.costs[kind].append({**cost.per_task(tasks), "client_cpu_us": round(client_us, 1)})
        if kind == "rota":
            self.statements = cost.top_statements(tasks)


def bench_claim(
    url: str,
    backlogs: list[int],
    tenants: int,
    connections: int,
    limit: int,
    samples: int,
    throughput_seconds: float,
    runs: int,
    priorities: Sequence[int] = (0,),
) -> dict[str, Any]:
    """`priorities`: the tasks' priorities, in turn (0,0,0,5,9: a fifth at 5,
    a fifth at 9): with urgent tasks waiting, claims swap slots within tenants."""
    size = max(backlogs[0], int(40_000 * throughput_seconds))
    with psycopg.connect(url, autocommit=True) as conn:
        measured = _Throughput(conn, url, connections, limit, throughput_seconds)
        kinds = list(measured.rates)
        for run in range(runs):
            # Each run starts with the next one in turn, so none always goes first.
            for kind in kinds[run % len(kinds) :] + kinds[: run % len(kinds)]:
                measured.run(kind, tenants, size, priorities)
    rate = {kind: statistics.median(rates) for kind, rates in measured.rates.items()}
    by_queue = {kind: median_costs(values) for kind, values in measured.costs.items()}
    statements = measured.statements
    return {
        "params": {
            "backlogs": backlogs,
            "tenants": tenants,
            "connections": connections,
            "claim_size": limit,
            "samples": samples,
            "runs": runs,
            "priorities": list(priorities),
        },
        "claim_complete_tasks_per_s": round(rate["rota"]),
        "fifo_baseline_tasks_per_s": round(rate[FIFO]),
        "ratio_to_fifo_baseline": ratio(rate["rota"], rate[FIFO]),
        "leased_fifo_baseline_tasks_per_s": round(rate[LEASED_FIFO]),
        "ratio_to_leased_fifo_baseline": ratio(rate["rota"], rate[LEASED_FIFO]),
        # rota's own rows claimed and completed by plain statements: what its
        # tables cost, apart from its logic (claim.sql, reports.sql) and its
        # client (rota.core).
        "rows_direct_tasks_per_s": round(rate[ROWS_DIRECT]),
        "ratio_to_rows_direct": ratio(rate["rota"], rate[ROWS_DIRECT]),
        "rows_direct_to_leased_fifo": ratio(rate[ROWS_DIRECT], rate[LEASED_FIFO]),
        # Per task claimed and completed: PostgreSQL's CPU and WAL, and the
        # claiming processes' CPU, for rota and the two baselines it is read beside.
        "per_task_by_queue": by_queue,
        # PostgreSQL's CPU and WAL per task claimed and completed (rota's).
        "postgresql_per_task": {
            key: value for key, value in by_queue["rota"].items() if key != "client_cpu_us"
        },
        **({"postgresql_statements": statements} if statements else {}),
        "runs": {
            f"{key}_tasks_per_s": [round(r) for r in measured.rates[kind]]
            for key, kind in (
                ("claim_complete", "rota"),
                ("fifo_baseline", FIFO),
                ("leased_fifo_baseline", LEASED_FIFO),
                ("rows_direct", ROWS_DIRECT),
            )
        },
        **backlog_scaling(url, backlogs, tenants, connections, limit, samples, priorities),
        "goal": {
            "claim_complete_tasks_per_s_at_least": 30_000,
            "p50_ratio_at_most": 1.2,
            "p50_ms_at_most": 2.0,
        },
    }


def lock_pressure(
    url: str, tenants: int, connections: int, limit: int, seconds: float
) -> dict[str, Any]:
    """Claimers racing while a sampler reads pg_locks and wait events: how many
    relations one claiming backend holds, whether they stay on the lock
    manager's fast path, and how often anyone waits on the lock manager."""
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
        for i in range(0, tenants, max(1, tenants // 10)):  # a tenth of them limited
            db.transact(
                conn, core.configure_tenant(skewed_tenant(i, tenants), concurrency_limit=50)
            )
        Filler(conn, tenants).fill(max(20_000, int(40_000 * seconds)))
    samples: list[tuple[int, int, int]] = []

    def sample(watcher: Conn) -> None:
        if row := watcher.execute(query("bench_lock_sample")).fetchone():
            samples.append((int(row[0] or 0), int(row[1] or 0), int(row[2] or 0)))

    with in_background(lambda: psycopg.connect(url, autocommit=True), sample):
        rate = claim_run(Filler, url, connections, limit, seconds)[0]
    return {
        "params": {
            "tenants": tenants,
            "connections": connections,
            "claim_size": limit,
            "seconds": seconds,
        },
        "claim_complete_tasks_per_s": round(rate),
        "samples": len(samples),
        "max_relations_locked_by_one_backend": max((s[0] for s in samples), default=0),
        "locks_off_fast_path_seen": sum(s[1] for s in samples),
        "lock_manager_waits_seen": sum(s[2] for s in samples),
        "goal": {"max_relations_locked_by_one_backend_below": 16},
    }
