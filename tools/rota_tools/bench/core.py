"""Benchmarks of the PostgreSQL core: bulk fair loading and claiming.

Each figure is reported beside its baseline measured in the same run, as the
median of several runs: the machines are shared and noisy, so ratios matter
more than absolute numbers.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from rota import core
from rota.core import db
from rota.core.db import Copy, Op, Row, UUIDArray
from rota.core.migrate import migrate
from rota.model.envelope import TaskEnvelope, make_envelope
from rota.runtime.process import tune_gc
from rota_tools.bench.cpu import PostgresCost
from rota_tools.sql import query
from rota_tools.stats import percentile

BATCH = 10_000
QUEUE = "bench"
FIFO = "fifo"  # the baselines' keys among backlog sizes
LEASED_FIFO = "leased_fifo"
ROWS_DIRECT = "rows_direct"  # rota's tables, claimed and completed by plain statements


def skewed_tenant(i: int, tenants: int) -> str:
    """1,000 tenants by default, one of them holding half the tasks."""
    if i % 2 == 0 or tenants == 1:
        return "t0000"
    return f"t{1 + (i // 2) % (tenants - 1):04d}"


def even_tenant(i: int, tenants: int) -> str:
    """The tenants holding equal shares of the tasks, in turn."""
    return f"t{i % tenants:04d}"


def make_tasks(
    count: int, tenants: int, start: int = 0, queue: str = QUEUE, priorities: Sequence[int] = (0,)
) -> Iterator[TaskEnvelope]:
    """Task i is at priority priorities[i % len(priorities)] (mixed: 0,0,0,5,9)."""
    now = datetime.now(UTC)
    for i in range(start, start + count):
        yield bench_task(i, queue, skewed_tenant(i, tenants), priorities[i % len(priorities)], now)


def bench_task(number: int, queue: str, tenant: str, priority: int, now: datetime) -> TaskEnvelope:
    """The benchmarks' task number `number` (its number is its first argument)."""
    return make_envelope(
        name="bench.noop",
        queue=queue,
        tenant=tenant,
        args=[number, "payload-padding-abcdefghij"],
        now=now,
        priority=priority,
    )


def reset(conn: psycopg.Connection[Any]) -> None:
    migrate(conn)
    conn.execute(query("bench_reset"))


def _load_batches(conn: psycopg.Connection[Any], batches: list[list[TaskEnvelope]]) -> float:
    started = time.perf_counter()
    for batch in batches:
        db.transact(conn, core.load(batch))
    return time.perf_counter() - started


def _copy_only(step: Copy) -> Op[None]:
    yield step


def _raw_copy(
    conn: psycopg.Connection[Any], batches: list[list[TaskEnvelope]], fair_index: bool = False
) -> float:
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
        rows = core.task_rows(zip(seq, batch, strict=False), queue_ids, tenant_ids, now)
        if fair_index:
            types = (*core.TASK_COPY_TYPES, "float8")
            copy = Copy(query("bench_indexed_copy"), placed(rows, batch), types)
        else:
            copy = Copy(query("bench_raw_copy"), rows, core.TASK_COPY_TYPES)
        db.transact(conn, _copy_only(copy))
    return time.perf_counter() - started


def median_costs(costs: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Each measure's median over the runs (None if it could not be taken)."""
    medians: dict[str, float | None] = {}
    for key in costs[0] if costs else ():
        values = [value for c in costs if (value := c[key]) is not None]
        medians[key] = round(statistics.median(values), 1) if values else None
    return medians


def bench_load(url: str, tasks: int, tenants: int, runs: int) -> dict[str, Any]:
    """Fair bulk load vs raw COPY of the same rows, and vs the ceiling of any
    fair design (one COPY into a table with a fair-order index), alternating,
    `runs` times."""
    raw_rates, indexed_rates, fair_rates = [], [], []
    costs: list[dict[str, float | None]] = []
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
            fair_rates.append(tasks / _load_batches(conn, batches))
            costs.append(cost.per_task(tasks))
            statements = cost.top_statements(tasks)
    raw, indexed, fair = (
        statistics.median(rates) for rates in (raw_rates, indexed_rates, fair_rates)
    )
    return {
        "params": {"tasks": tasks, "tenants": tenants, "batch": BATCH, "runs": runs},
        "raw_copy_rows_per_s": round(raw),
        "fair_load_tasks_per_s": round(fair),
        "fair_to_raw_ratio": round(fair / raw, 3),
        # No fair design that keeps a claim index can beat this ratio.
        "fair_index_copy_rows_per_s": round(indexed),
        "fair_index_copy_to_raw_ratio": round(indexed / raw, 3),
        "postgresql_per_task": median_costs(costs),
        **({"postgresql_statements": statements} if statements else {}),
        "runs": {
            "raw_copy": [round(r) for r in raw_rates],
            "fair_index_copy": [round(r) for r in indexed_rates],
            "fair_load": [round(r) for r in fair_rates],
        },
        "goal": {"fair_to_raw_ratio_at_least": 0.8},
    }


LOAD_APPLICATION = "rota-bench-load"  # the parallel loaders' backends, for the sampler


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


class _WaitSampler:
    """Samples what the loaders' backends wait on, every few milliseconds,
    from a connection of its own (pg_stat_activity), until stopped."""

    def __init__(self, url: str, every: float = 0.005) -> None:
        import threading

        self.url, self.every = url, every
        self.samples = 0  # backend samples taken while loading
        self.waits: defaultdict[str, int] = defaultdict(int)  # "type:event" -> samples
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _WaitSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    query("bench_load_waits"), {"application": LOAD_APPLICATION}
                ).fetchall()
                for _pid, kind, event in rows:
                    if kind == "Client" and event == "ClientRead":
                        continue  # idle between statements: the client's time
                    self.samples += 1
                    if kind:
                        self.waits[f"{kind}:{event}"] += 1
                self._stop.wait(self.every)

    @property
    def lock_waits(self) -> int:
        return sum(n for key, n in self.waits.items() if key.startswith("Lock:"))


def _timed_parallel_load(
    url: str, tasks: int, tenants: int, parts: int
) -> tuple[float, _WaitSampler]:
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
    with _WaitSampler(url) as sampler:
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
        "ratio_to_one": round(many / one, 3),
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


class Filler:
    """Tops a bench queue up to a backlog size, numbering tasks uniquely, and
    claims from it as a worker does."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        tenants: int,
        queue: str = QUEUE,
        priorities: Sequence[int] = (0,),
    ) -> None:
        self.conn, self.tenants, self.queue, self.next_number = conn, tenants, queue, 0
        self.priorities = priorities
        self.replaced: dict[int, int] = {}  # task number -> priority, of the tasks replace() added

    def waiting(self) -> int:
        return int(db.run(self.conn, core.queue_counts()).get(self.queue, {}).get("ready", 0))

    def fill(self, target: int) -> None:
        self.add(max(0, target - self.waiting()))
        self.conn.execute(query("bench_analyze_ready"))

    def add(self, count: int) -> None:
        rows = make_tasks(
            count, self.tenants, self.next_number, self.queue, priorities=self.priorities
        )
        self.next_number += count
        self._load(rows)

    def replace(self, claimed: Sequence[Any]) -> None:
        """Adds a task like each claimed one (its tenant and priority), so that
        the queue keeps its mix: claims take a tenant's urgent tasks first,
        and tasks added in the plain turn would leave a small queue with
        almost none, where a large one keeps its own for thousands of claims."""
        now = datetime.now(UTC)
        first, self.next_number = self.next_number, self.next_number + len(claimed)
        for number, task in enumerate(claimed, first):
            self.replaced[number] = self._priority(task.args[0])
        self._load(
            bench_task(number, self.queue, task.tenant, self.replaced[number], now)
            for number, task in enumerate(claimed, first)
        )

    def _load(self, rows: Iterator[TaskEnvelope]) -> None:
        while batch := list(itertools.islice(rows, BATCH)):
            db.transact(self.conn, core.load(batch))

    def _priority(self, number: int) -> int:
        return self.replaced.get(number, self.priorities[number % len(self.priorities)])

    def claim(self, limit: int) -> Sequence[Any]:
        return db.run(self.conn, core.claim([self.queue], limit, "bench"))

    def finish(self, claimed: Sequence[Any]) -> int:
        return len(db.run(self.conn, core.complete(t.token for t in claimed)))


def in_schema(conn: psycopg.Connection[Any], block: str, schema: str) -> bytes:
    """A bench.sql block with its `{schema}` filled in, as an identifier."""
    return sql.SQL(block).format(schema=sql.Identifier(schema)).as_bytes(conn)


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
        conn: psycopg.Connection[Any],
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

    def __init__(self, conn: psycopg.Connection[Any], queue: str = QUEUE) -> None:
        self.conn, self.queue = conn, queue
        self.claim_query = query("bench_rows_direct_claim")
        self.finish_query = query("bench_rows_direct_finish")

    def claim(self, limit: int) -> Sequence[Any]:
        params = {"queue": self.queue, "limit": limit}
        return self.conn.execute(self.claim_query, params, prepare=True).fetchall()

    def finish(self, claimed: Sequence[Any]) -> int:
        ids = UUIDArray(row[0] for row in claimed)
        return self.conn.execute(self.finish_query, {"ids": ids}, prepare=True).rowcount


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
    baselines: Mapping[str, FifoFiller],
    baseline_sizes: Mapping[str, int],
    samples: int,
    limit: int,
) -> dict[str, list[float]]:
    """Claim latencies of rota's queues and of these baselines, in the same
    turns; the baselines are filled first and dropped after."""
    try:
        for key, baseline in baselines.items():
            baseline.fill(baseline_sizes[key])
        return _interleaved_claim_latencies(
            {**fillers, **baselines}, {**sizes, **baseline_sizes}, samples, limit
        )
    finally:
        for baseline in baselines.values():
            baseline.drop()


def _claim_worker(args: tuple[str, str, int, float]) -> tuple[int, float]:
    """Claims and finishes in a loop for `seconds`; `kind` is "rota" or a
    baseline's (FIFO, LEASED_FIFO, ROWS_DIRECT). Returns the tasks done and
    the CPU seconds the loop took in this process."""
    kind, url, limit, seconds = args
    done = 0
    with db.connect(url, synchronous_commit=False) as conn:  # as workers claim
        # Autocommit: each call is one statement, atomic on its own.
        claimer: Filler | FifoFiller | RowsDirect = (
            Filler(conn, tenants=0)
            if kind == "rota"
            else RowsDirect(conn)
            if kind == ROWS_DIRECT
            else FifoFiller(conn, kind, leased=kind == LEASED_FIFO)
        )
        cpu = time.process_time()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            got = claimer.claim(limit)
            if not got:
                break
            done += claimer.finish(got)
        return done, time.process_time() - cpu


def claim_run(
    kind: str,
    url: str,
    connections: int,
    limit: int,
    seconds: float,
    on_start: Callable[[], None] | None = None,
) -> tuple[float, float]:
    """Tasks/s claimed and completed by `connections` processes in `seconds`,
    and those processes' CPU (µs) per task; `on_start` is called once they
    are up, as the clock starts."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(connections, initializer=tune_gc) as pool:
        pool.map(time.sleep, [0.0] * connections)  # workers up before the clock starts
        if on_start is not None:
            on_start()
        started = time.perf_counter()
        results = pool.map(_claim_worker, [(kind, url, limit, seconds)] * connections)
        elapsed = time.perf_counter() - started
    done = sum(n for n, _ in results)
    return done / elapsed, sum(cpu for _, cpu in results) * 1e6 / max(1, done)


def churn(url: str, queue: str, tasks: int, connections: int, limit: int) -> float:
    """Claims and completes `tasks` tasks of `queue` with `connections` processes;
    returns tasks/s."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(connections, initializer=tune_gc) as pool:
        started = time.perf_counter()
        per = [(url, queue, limit, tasks // connections) for _ in range(connections)]
        done = sum(pool.map(_churn_worker, per))
        elapsed = time.perf_counter() - started
    return done / elapsed


def _churn_worker(args: tuple[str, str, int, int]) -> int:
    url, queue, limit, quota = args
    done = 0
    with db.connect(url, synchronous_commit=False) as conn:  # as workers claim
        claimer = Filler(conn, tenants=0, queue=queue)
        while done < quota:
            got = claimer.claim(min(limit, quota - done))
            if not got:
                break
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
            key: Filler(conn, tenants, _queue_for(size), priorities)
            for key, size in size_of.items()
        }
        for key, filler in fillers.items():
            filler.fill(size_of[key])
        # The baselines in two sets of turns, each with one large baseline
        # queue beside rota's: the working set each claim competes with is
        # the same in both.
        before = _claim_latencies_beside(
            fillers,
            size_of,
            {FIFO: FifoFiller(conn, FIFO, priorities), small: FifoFiller(conn, small, priorities)},
            {FIFO: sizes[-1], small: sizes[0]},
            samples,
            limit,
        )
        beside_leased = _claim_latencies_beside(
            fillers,
            size_of,
            {LEASED_FIFO: FifoFiller(conn, LEASED_FIFO, leased=True)},
            {LEASED_FIFO: sizes[-1]},
            samples,
            limit,
        )
        fillers[largest].fill(2 * sizes[-1])
        churn_rate = churn(url, _queue_for(sizes[-1]), sizes[-1], connections, limit)
        after = _interleaved_claim_latencies(
            {key: fillers[key] for key in (smallest, largest)}, size_of, samples, limit
        )
    latency = {key: _latency_figures(before[key]) for key in size_of}
    latency[f"{largest}_after_churn"] = _latency_figures(after[largest])
    p50 = {key: statistics.median(times) for key, times in before.items()}
    return {
        "churn_tasks_per_s": round(churn_rate),
        "claim_latency": latency,
        # The plain SKIP LOCKED claim (no fairness, limits or leases) of as many
        # tasks, with the same priorities, timed in the same turns: the
        # baseline of the claim's absolute latency on this machine at this
        # hour, and of its growth with depth.
        "fifo_baseline_claim_latency": {
            largest: _latency_figures(before[FIFO]),
            smallest: _latency_figures(before[small]),
        },
        "p50_ratio_to_fifo_baseline": round(p50[largest] / p50[FIFO], 3),
        "fifo_baseline_p50_ratio_largest_to_smallest": round(p50[FIFO] / p50[small], 3),
        # The plain FIFO that records leases, timed in turns of its own with
        # rota's queues: the least any queue that gives a crashed worker's
        # tasks back must do.
        "leased_fifo_baseline_claim_latency": {
            largest: _latency_figures(beside_leased[LEASED_FIFO])
        },
        "p50_ratio_to_leased_fifo_baseline": round(
            statistics.median(beside_leased[largest])
            / statistics.median(beside_leased[LEASED_FIFO]),
            3,
        ),
        "p50_ratio_largest_to_smallest": round(p50[largest] / p50[smallest], 3),
        # Against the smallest queue measured in the same turns after the churn
        # (with one size only, against its own p50 before the churn).
        "p50_ratio_after_churn_to_smallest": round(
            statistics.median(after[largest])
            / statistics.median(after[smallest] if smallest != largest else before[smallest]),
            3,
        ),
    }


def _latency_figures(times: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(times), 3),
        "p99_ms": round(percentile(times, 0.99), 3),
    }


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
    with psycopg.connect(url, autocommit=True) as conn:
        # Throughput: claim + complete, `connections` processes, alternating
        # with the baselines (rota's rows written directly, the plain FIFO
        # without and with leases), `runs` times; each one's cost per task
        # on the server and in the claiming processes.
        by_kind: dict[str, list[float]] = {"rota": [], ROWS_DIRECT: [], FIFO: [], LEASED_FIFO: []}
        split: dict[str, list[dict[str, float | None]]] = {
            "rota": [],
            ROWS_DIRECT: [],
            LEASED_FIFO: [],
        }
        statements: list[dict[str, Any]] | None = None
        size = max(backlogs[0], int(40_000 * throughput_seconds))

        def checkpoint() -> None:
            with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
                conn.execute(query("bench_checkpoint"))

        def measured(kind: str) -> float:
            cost = PostgresCost(conn)
            rate, client_us = claim_run(kind, url, connections, limit, throughput_seconds)
            per_task = cost.per_task(max(1, round(rate * throughput_seconds)))
            if kind in split:
                split[kind].append({**per_task, "client_cpu_us": round(client_us, 1)})
            if kind == "rota":
                nonlocal statements
                statements = cost.top_statements(max(1, round(rate * throughput_seconds)))
            return rate

        kinds = list(by_kind)
        for run in range(runs):
            # Fresh tables for each, as the baselines' are: the effect of churn
            # on claims is what backlog-scaling measures. Each run starts with
            # the next one in turn, so none always goes first.
            for kind in kinds[run % len(kinds) :] + kinds[: run % len(kinds)]:
                checkpoint()
                if kind in ("rota", ROWS_DIRECT):
                    reset(conn)
                    Filler(conn, tenants, priorities=priorities).fill(size)
                    by_kind[kind].append(measured(kind))
                    continue
                baseline = FifoFiller(conn, kind, leased=kind == LEASED_FIFO)
                try:
                    baseline.fill(size)
                    by_kind[kind].append(measured(kind))
                finally:
                    baseline.drop()
    rates, direct_rates = by_kind["rota"], by_kind[ROWS_DIRECT]
    fifo_rates, leased_rates = by_kind[FIFO], by_kind[LEASED_FIFO]
    by_queue = {kind: median_costs(values) for kind, values in split.items()}
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
        "claim_complete_tasks_per_s": round(statistics.median(rates)),
        "fifo_baseline_tasks_per_s": round(statistics.median(fifo_rates)),
        "ratio_to_fifo_baseline": round(
            statistics.median(rates) / statistics.median(fifo_rates), 3
        ),
        "leased_fifo_baseline_tasks_per_s": round(statistics.median(leased_rates)),
        "ratio_to_leased_fifo_baseline": round(
            statistics.median(rates) / statistics.median(leased_rates), 3
        ),
        # rota's own rows claimed and completed by plain statements: what its
        # tables cost, apart from its logic (claim.sql, reports.sql) and its
        # client (rota.core).
        "rows_direct_tasks_per_s": round(statistics.median(direct_rates)),
        "ratio_to_rows_direct": round(
            statistics.median(rates) / statistics.median(direct_rates), 3
        ),
        "rows_direct_to_leased_fifo": round(
            statistics.median(direct_rates) / statistics.median(leased_rates), 3
        ),
        # Per task claimed and completed: PostgreSQL's CPU and WAL, and the
        # claiming processes' CPU, for rota and the two baselines it is read beside.
        "per_task_by_queue": by_queue,
        # PostgreSQL's CPU and WAL per task claimed and completed (rota's).
        "postgresql_per_task": {
            key: value for key, value in by_queue["rota"].items() if key != "client_cpu_us"
        },
        **({"postgresql_statements": statements} if statements else {}),
        "runs": {
            "claim_complete_tasks_per_s": [round(r) for r in rates],
            "fifo_baseline_tasks_per_s": [round(r) for r in fifo_rates],
            "leased_fifo_baseline_tasks_per_s": [round(r) for r in leased_rates],
            "rows_direct_tasks_per_s": [round(r) for r in direct_rates],
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
    import threading

    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
        for i in range(0, tenants, max(1, tenants // 10)):  # a tenth of them limited
            db.transact(
                conn, core.configure_tenant(skewed_tenant(i, tenants), concurrency_limit=50)
            )
        Filler(conn, tenants).fill(max(20_000, int(40_000 * seconds)))
    samples: list[tuple[int, int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(url, autocommit=True) as watcher:
            while not stop.is_set():
                row = watcher.execute(query("bench_lock_sample")).fetchone()
                if row:
                    samples.append((int(row[0] or 0), int(row[1] or 0), int(row[2] or 0)))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        rate = claim_run("rota", url, connections, limit, seconds)[0]
    finally:
        stop.set()
        sampler.join()
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
