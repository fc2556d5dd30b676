"""`rota bench fleet`: a web fleet enqueueing one task per request, through
rota and through the designs that write each task to PostgreSQL as the
request runs, side by side on the same servers, one system after another.

The fleet is P handler processes of T threads each (a process pool, kept for
the whole run). Each thread is a Poisson source at its share of the offered
rate, so the fleet's requests arrive as one Poisson stream; a request
enqueues ONE task of a tenant drawn zipf (s = 1) from 1,000, through the
system's public API, and its enqueue call is timed. Each thread sends one
untimed request first (its connection warm), and the clock starts once
those tasks ran. Two consumers run the no-op tasks.

- rota: `task.using(tenant=...).enqueue(...)` into the Redis buffer, a
  Python loader, two `rota worker` processes.
- rota_direct: rota's own write to PostgreSQL (`connection=` on the
  handler's connection in autocommit: the transactional enqueue, and what
  the producer's fallback writes), the same workers, no loader.
- pgqueuer and procrastinate: their sync enqueue (`SyncQueries.enqueue`,
  `Task.defer` on a pool of T connections a process), two of their workers,
  each in a database of its own on the same server.
- insert_per_request (the floor): one INSERT and its commit per request
  into a plain table, two consumers claiming 100 with SKIP LOCKED, polling
  every 10 ms when they find nothing.

PostgreSQL's CPU is its whole process tree's (rota_tools.bench.cpu): the
postmaster, every backend alive at either end of the window, and the
backends that exited meanwhile, whose CPU the kernel adds to the
postmaster's children's times when it reaps them; less the two backends of
the bench itself (the sampler and the one that waits for the tasks), read
from /proc. The window runs from the first request to the last task of the
run started. pg_stat_activity is sampled every 10 ms on a connection of
its own, which leaves itself and the bench's connection out.

The stall: every PostgreSQL process (the postmaster first, then its
children) SIGSTOPped in the middle of a run of its own, then SIGCONTed; what
each request overlapping it took, which ones failed, and whether every
acknowledged task ran once the server was back.
"""

from __future__ import annotations

import abc
import asyncio
import bisect
import contextlib
import itertools
import json
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

from rota import Settings
from rota_tools.bench.cpu import Probe, postgres_probe, process_seconds
from rota_tools.bench.harness import (
    PAD,
    QUEUE,
    Conn,
    bench_app,
    empty,
    fresh_database,
    in_schema,
    ratio,
    stopping,
    wait_for,
    warm_pool,
    workers,
)
from rota_tools.devservers import descendants, proc_stat
from rota_tools.processes import spawn_loader
from rota_tools.sql import query
from rota_tools.stats import percentile

SYSTEMS = ("rota", "rota_direct", "pgqueuer", "procrastinate", "insert_per_request")
PEERS = ("pgqueuer", "procrastinate")  # the queues a user would otherwise pick
TENANTS = 1000
ZIPF_EXPONENT = 1.0
QUIET_RANK = 100  # tenants ranked this or lower hold under 0.2% of the tasks each
P99_GOAL_MS = 5.0  # the sweep's bound on the handlers' p99
CONSUMERS = 2
CONSUMER_BATCH = 100
CONSUMER_CONCURRENCY = 8
POLL_SECONDS = 0.01  # the floor's consumers, when they find nothing
SAMPLE_SECONDS = 0.01
DRAIN_SECONDS = 120.0  # for the tasks of a run to start, after its last request
SCHEMA = "rota_bench_fleet"
PGQUEUER_DATABASE = "rota_fleet_pgqueuer"
PROCRASTINATE_DATABASE = "rota_fleet_procrastinate"
# Every tenant's share of the requests, cumulated: tenant k (from 0) has
# weight 1 / (k + 1) ** s.
_CUMULATIVE = list(itertools.accumulate(1 / (k + 1) ** ZIPF_EXPONENT for k in range(TENANTS)))

Send = Callable[[str], str]  # a request: enqueues one task of the tenant, returns its id
Request = tuple[float, float, str | None, str | None]  # start (time.time), ms, id, error


def log(line: str) -> None:
    """Progress, on stderr (the report goes to stdout)."""
    print(f"{time.strftime('%H:%M:%S')} fleet: {line}", file=sys.stderr, flush=True)


def parse_handlers(text: str) -> tuple[int, int]:
    """`PxT` (processes by threads, e.g. 8x32) as (P, T)."""
    processes, sep, threads = text.lower().partition("x")
    if not sep or not processes.isdigit() or not threads.isdigit():
        raise ValueError(f"--handlers takes PROCESSESxTHREADS (e.g. 8x32), not {text!r}")
    if int(processes) < 1 or int(threads) < 1:
        raise ValueError("--handlers: at least one process of one thread")
    return int(processes), int(threads)


def parse_systems(text: str) -> list[str]:
    systems = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        raise ValueError(f"--systems: choose from {', '.join(SYSTEMS)}, not {text!r}")
    return [s for s in SYSTEMS if s in systems]  # always in the same order


def zipf_tenant(rng: random.Random) -> str:
    return f"t{bisect.bisect(_CUMULATIVE, rng.random() * _CUMULATIVE[-1]):04d}"


def _payload(tenant: str) -> str:
    return json.dumps({"tenant": tenant, "enqueued_at": time.time(), "pad": PAD})


# The handlers: one call of `_handle` per pool process and run.


@dataclass(frozen=True)
class Offer:
    """What every handler process does in a run."""

    system: str
    settings: Settings  # rota's servers
    url: str  # the system's database
    processes: int
    threads: int
    rate: float  # tasks/s, the whole fleet's
    seconds: float


def _procrastinate_app(connector: Any, record: Callable[[int, str, float], None] | None) -> Any:
    """procrastinate's app with the no-op task; `record` is called by the
    task as it runs (its job id, tenant, enqueue -> start ms)."""
    import procrastinate

    app = procrastinate.App(connector=connector)

    @app.task(name="noop", queue=QUEUE, pass_context=True)
    async def noop(context: Any, tenant: str, enqueued_at: float, pad: str) -> None:
        if record is not None:
            record(context.job.id, tenant, (time.time() - enqueued_at) * 1000)

    return app


@contextlib.contextmanager
def _senders(offer: Offer) -> Iterator[Callable[[], Send]]:
    """Makes each thread's request (its connection opened), all closed at the end."""
    with contextlib.ExitStack() as stack:

        def connection() -> Conn:
            return stack.enter_context(psycopg.connect(offer.url, autocommit=True))

        if offer.system in ("rota", "rota_direct"):
            app = bench_app(offer.settings)
            stack.callback(app.close)
            noop = app.tasks["noop"]
            if offer.system == "rota":
                yield lambda: lambda tenant: str(noop.using(tenant=tenant).enqueue(0, PAD))
                return

            def direct() -> Send:
                conn = connection()
                return lambda tenant: str(
                    noop.using(tenant=tenant, connection=conn).enqueue(0, PAD)
                )

            yield direct
        elif offer.system == "pgqueuer":
            from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
            from pgqueuer.queries import SyncQueries

            def pgqueuer() -> Send:
                queries = SyncQueries(SyncPsycopgDriver(connection()))
                return lambda tenant: str(queries.enqueue("noop", _payload(tenant).encode(), 0)[0])

            yield pgqueuer
        elif offer.system == "procrastinate":
            import procrastinate

            size = offer.threads  # a connection for each thread, as the others have
            connector = procrastinate.SyncPsycopgConnector(
                conninfo=offer.url, min_size=size, max_size=size
            )
            app = _procrastinate_app(connector, None)
            app.open()
            stack.callback(app.close)
            task = app.tasks["noop"]
            yield (
                lambda: (
                    lambda tenant: str(task.defer(tenant=tenant, enqueued_at=time.time(), pad=PAD))
                )
            )
        else:

            def insert() -> Send:
                conn = connection()
                statement = in_schema(conn, query("bench_fleet_insert"), SCHEMA)

                def send(tenant: str) -> str:
                    params = {"payload": _payload(tenant), "enqueued_at": time.time()}
                    row = conn.execute(statement, params, prepare=True).fetchone()
                    assert row is not None
                    return str(row[0])

                return send

            yield insert


def _requests(send: Send, rng: random.Random, rate: float, seconds: float) -> list[Request]:
    """A thread's requests: Poisson arrivals at `rate` for `seconds`, each
    sent at its time (or at once, when the previous one ended later)."""
    done: list[Request] = []
    started = time.perf_counter()
    at = started
    while (at := at + rng.expovariate(rate)) < started + seconds:
        if (delay := at - time.perf_counter()) > 0:
            time.sleep(delay)
        tenant = zipf_tenant(rng)
        wall, began = time.time(), time.perf_counter()
        try:
            got, error = send(tenant), None
        except Exception as exc:  # what the handler saw, reported
            got, error = None, type(exc).__name__
        done.append((wall, (time.perf_counter() - began) * 1000, got, error))
    return done


def _handle(args: tuple[Offer, int, Any, Any]) -> list[Request]:
    """A handler process's run: its threads' senders made and each sent one
    untimed request (their ids go on `warm`), then, once `barrier` lets
    every process go, its threads' requests."""
    offer, index, barrier, warm = args
    with _senders(offer) as make:
        senders = [make() for _ in range(offer.threads)]
        seeds = random.Random(f"{offer.system}-{offer.rate}-{index}")
        rngs = [random.Random(seeds.random()) for _ in senders]
        warm.put([send(zipf_tenant(rng)) for send, rng in zip(senders, rngs, strict=True)])
        barrier.wait(timeout=DRAIN_SECONDS)
        share = offer.rate / (offer.processes * offer.threads)
        results: list[list[Request]] = [[] for _ in senders]

        def run(i: int) -> None:
            results[i] = _requests(senders[i], rngs[i], share, offer.seconds)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(senders))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return [request for done in results for request in done]


# The consumers, and what they ran.


class Ran(abc.ABC):
    """The tasks a system's consumers started: id -> (tenant, enqueue ->
    start ms), and how many starts there were (a task started twice counts
    twice)."""

    def __init__(self) -> None:
        self.tasks: dict[str, tuple[str, float]] = {}
        self.starts = 0

    @abc.abstractmethod
    def refresh(self, wanted: set[str]) -> None:
        """Reads what ran since the last call (`wanted`: the tasks waited for)."""

    def has(self, wanted: set[str]) -> bool:
        self.refresh(wanted)
        return wanted.issubset(self.tasks)


class RotaRan(Ran):
    """What rota's workers finished (rota.finished), read once enough did."""

    def __init__(self, conn: Conn) -> None:
        super().__init__()
        self.conn = conn

    def refresh(self, wanted: set[str]) -> None:
        row = self.conn.execute(query("bench_finished_count")).fetchone()
        missing = len(wanted.difference(self.tasks))
        if row is None or row[0] < len(self.tasks) + missing or row[0] == self.starts:
            return
        self.starts = int(row[0])
        rows = self.conn.execute(query("bench_fleet_finished")).fetchall()
        self.tasks = {task: (tenant, float(ms)) for task, tenant, ms in rows}


class LogRan(Ran):
    """What the peers' consumers started, as each wrote it to a log of its own
    in `folder`: a line `id tenant ms` per start."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        self.offsets: dict[Path, int] = {}

    def refresh(self, wanted: set[str]) -> None:
        for path in self.folder.glob("*.log"):
            with path.open("rb") as log:
                log.seek(self.offsets.get(path, 0))
                data = log.read()
            whole = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
            self.offsets[path] = self.offsets.get(path, 0) + len(whole)
            for line in whole.decode().splitlines():
                task, tenant, ms = line.split()
                self.starts += 1
                self.tasks.setdefault(task, (tenant, float(ms)))


def _log_writer(folder: str) -> Callable[[Any, str, float], None]:
    log = (Path(folder) / f"{os.getpid()}.log").open("a", buffering=1)  # a line at a time

    def record(task: Any, tenant: str, ms: float) -> None:
        log.write(f"{task} {tenant} {ms:.3f}\n")

    return record


def _insert_consumer(url: str, folder: str, ready: Any) -> None:
    record = _log_writer(folder)
    with psycopg.connect(url, autocommit=True) as conn:
        claim = in_schema(conn, query("bench_pgqueue_claim"), SCHEMA)
        finish = in_schema(conn, query("bench_pgqueue_finish"), SCHEMA)
        ready.set()
        while True:
            rows = conn.execute(claim, {"limit": CONSUMER_BATCH}, prepare=True).fetchall()
            now = time.time()
            if not rows:
                time.sleep(POLL_SECONDS)
                continue
            for task, payload, enqueued_at in rows:
                record(task, payload["tenant"], (now - enqueued_at) * 1000)
            conn.execute(finish, {"ids": [row[0] for row in rows]}, prepare=True)


async def _pgqueuer_consume(url: str, folder: str, ready: Any) -> None:
    from pgqueuer import PgQueuer

    record = _log_writer(folder)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        pgq = PgQueuer.from_psycopg_connection(conn)

        @pgq.entrypoint("noop")
        async def noop(job: Any) -> None:
            body = json.loads(job.payload)
            record(job.id, body["tenant"], (time.time() - body["enqueued_at"]) * 1000)

        ready.set()
        await pgq.run(batch_size=CONSUMER_BATCH, dequeue_timeout=timedelta(seconds=1))


async def _procrastinate_consume(url: str, folder: str, ready: Any) -> None:
    import procrastinate

    app = _procrastinate_app(procrastinate.PsycopgConnector(conninfo=url), _log_writer(folder))
    async with app.open_async():
        ready.set()
        await app.run_worker_async(
            queues=[QUEUE],
            concurrency=CONSUMER_CONCURRENCY,
            install_signal_handlers=False,
            delete_jobs="always",
        )


def _peer_consumer(system: str, url: str, folder: str, ready: Any) -> None:
    if system == "pgqueuer":
        asyncio.run(_pgqueuer_consume(url, folder, ready))
    elif system == "procrastinate":
        asyncio.run(_procrastinate_consume(url, folder, ready))
    else:
        _insert_consumer(url, folder, ready)


async def _install_pgqueuer(url: str) -> None:
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await Queries(PsycopgDriver(conn)).install()


def _install_procrastinate(url: str) -> None:
    import procrastinate

    app = _procrastinate_app(procrastinate.SyncPsycopgConnector(conninfo=url), None)
    with app.open():
        app.schema_manager.apply_schema()


@contextlib.contextmanager
def _consumers(system: str, settings: Settings, conn: Conn) -> Iterator[tuple[str, Ran]]:
    """The system's database, made afresh, with its two consumers running:
    its URL, and what they ran."""
    if system in ("rota", "rota_direct"):
        empty(conn, settings)
        loaders = [spawn_loader(settings)] if system == "rota" else []
        options = {"concurrency": CONSUMER_CONCURRENCY, "batch_size": CONSUMER_BATCH}
        with stopping(loaders), workers(settings, CONSUMERS, **options) as running:
            live = lambda: conn.execute(query("bench_live_workers")).fetchone() == (CONSUMERS,)  # noqa: E731
            processes = [*loaders, *running]
            wait_for(live, 60, what="the workers to register", processes=processes)
            yield settings.database_url, RotaRan(conn)
        return
    if system == "pgqueuer":
        url = fresh_database(settings.database_url, PGQUEUER_DATABASE)
        asyncio.run(_install_pgqueuer(url))
    elif system == "procrastinate":
        url = fresh_database(settings.database_url, PROCRASTINATE_DATABASE)
        _install_procrastinate(url)
    else:
        url = settings.database_url
        conn.execute(in_schema(conn, query("bench_fifo_schema"), SCHEMA))
        conn.execute(in_schema(conn, query("bench_pgqueue_setup"), SCHEMA))
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix=f"rota-fleet-{system}-") as folder:
        events = [ctx.Event() for _ in range(CONSUMERS)]
        started = [
            ctx.Process(target=_peer_consumer, args=(system, url, folder, ready), daemon=True)
            for ready in events
        ]
        for process in started:
            process.start()
        try:

            def up() -> bool:
                ready = all(e.is_set() for e in events)
                return ready or not all(p.is_alive() for p in started)

            wait_for(up, 60, what=f"the {system} consumers to start")
            if not all(e.is_set() for e in events):
                raise RuntimeError(f"benchmark: a {system} consumer exited at its start")
            yield url, LogRan(Path(folder))
        finally:
            for process in started:
                process.terminate()
                process.join(10)
                if process.is_alive():
                    process.kill()
                    process.join()
            if system == "insert_per_request":
                conn.execute(in_schema(conn, query("bench_fifo_drop_schema"), SCHEMA))


# What PostgreSQL did meanwhile.


class Sampler:
    """pg_stat_activity every SAMPLE_SECONDS while `sampling`, on a connection
    of its own kept for the whole bench (its backend's CPU is read at both
    ends of a window, to be left out): each backend's wait event, and the
    most client backends seen open at once. Idle client backends (between
    requests) are not counted as waiting; a background process only when it
    does something other than wait for work (type Activity)."""

    def __init__(self, url: str, others: Sequence[int]) -> None:
        self.conn: Conn = psycopg.connect(url, autocommit=True)
        self.pid = self.conn.info.backend_pid
        self.others = list(others)
        self.waits: Counter[str] = Counter()
        self.peak_connections = 0
        self.on = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        statement = query("bench_fleet_activity")
        while not self.stop.is_set():
            if not self.on.wait(0.1):
                continue
            rows = self.conn.execute(statement, {"others": self.others}).fetchall()
            clients = 0
            for backend_type, state, kind, event in rows:
                if backend_type == "client backend":
                    clients += 1
                    if state != "idle":
                        self.waits[f"{kind}:{event}" if kind else "CPU"] += 1
                elif kind and kind != "Activity":
                    self.waits[f"{kind}:{event}"] += 1
            self.peak_connections = max(self.peak_connections, clients)
            self.stop.wait(SAMPLE_SECONDS)

    @contextlib.contextmanager
    def sampling(self) -> Iterator[None]:
        self.waits, self.peak_connections = Counter(), 0
        self.on.set()
        try:
            yield
        finally:
            self.on.clear()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.conn.close()


class PostgresCpu:
    """The server's CPU over a window (every process, exited ones included)
    less the bench's own backends'."""

    def __init__(self, tree: Probe, own: Sequence[int]) -> None:
        self.tree, self.own = tree, own
        self.start = self._now()

    def _now(self) -> float | None:
        total = self.tree()
        own = [process_seconds(pid) for pid in self.own]
        if total is None or None in own:
            return None
        return total - sum(s for s in own if s is not None)

    def seconds(self) -> float | None:
        end = self._now()
        return None if end is None or self.start is None else end - self.start


# A command that runs the server as another user, and stops itself when its
# child stops (as a shell's job control would): stopped first and let go
# last with the server, or it stays stopped after the stall.
WRAPPERS = {"runuser", "su", "sudo"}


def _wrappers(pid: int) -> list[int]:
    """The processes of WRAPPERS that run `pid`, innermost first."""
    found = []
    while (fields := proc_stat(pid)) is not None and (parent := int(fields[1])) > 1:
        try:
            name = Path(f"/proc/{parent}/comm").read_text().strip()
        except OSError:
            break
        if name not in WRAPPERS:
            break
        found.append(parent)
        pid = parent
    return found


def _stopped(pid: int) -> bool:
    fields = proc_stat(pid)
    return fields is not None and fields[0] == "T"


class Stall:
    """Every PostgreSQL process stopped, `seconds` after `delay`, then let go:
    when it began and ended (time.time)."""

    def __init__(self, postmaster: int, delay: float, seconds: float) -> None:
        self.postmaster, self.delay, self.length = postmaster, delay, seconds
        self.began = self.ended = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        time.sleep(self.delay)  # the run's middle: a point in time, not a condition
        wrappers = _wrappers(self.postmaster)[::-1]  # outermost first
        stopped: list[int] = []
        try:
            # The postmaster before its children: it forks no backend meanwhile.
            for pid in [*wrappers, self.postmaster]:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            for pid in descendants(self.postmaster):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
            self.began = time.time()
            time.sleep(self.length)
            self.ended = time.time()
        finally:
            for pid in reversed(stopped):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            if wrappers:
                # One that saw its child stop (it was stopped first, so it
                # cannot have) would stop itself once let go: a safeguard.
                time.sleep(0.1)
                for pid in wrappers:
                    if _stopped(pid):
                        os.kill(pid, signal.SIGCONT)

    def join(self) -> None:
        self.thread.join()


# The runs.


def _ms(values: Sequence[float], *quantiles: str) -> dict[str, float]:
    q = {"p50": 0.5, "p99": 0.99, "p999": 0.999}
    out = {name: round(percentile(values, q[name]), 2) for name in quantiles if name != "max"}
    if "max" in quantiles:
        out["max"] = round(max(values, default=0.0), 2)
    return out


@dataclass
class Bench:
    """The servers, the handler processes and the sampler every run shares."""

    settings: Settings
    conn: Conn  # the bench's own connection: setup, and waiting for the tasks
    pool: Any  # the handler processes
    manager: Any  # a multiprocessing manager: the runs' barrier and warm-up queue
    sampler: Sampler
    postmaster: int | None  # None: the server is not on this machine
    processes: int
    threads: int
    notes: list[str] = field(default_factory=list)

    def run(
        self, system: str, url: str, ran: Ran, rate: float, seconds: float, stall: float = 0.0
    ) -> dict[str, Any]:
        """One run of the fleet at `rate` for `seconds`, its figures; with
        `stall`, PostgreSQL stopped that long in its middle."""
        log(
            f"{system}: {rate:g} tasks/s for {seconds:g} s"
            + (f", {stall:g} s stall" if stall else "")
        )
        offer = Offer(system, self.settings, url, self.processes, self.threads, rate, seconds)
        barrier = self.manager.Barrier(self.processes + 1)
        warm = self.manager.Queue()
        pending = self.pool.map_async(
            _handle, [(offer, i, barrier, warm) for i in range(self.processes)]
        )
        warm_ids: set[str] = set()
        for _ in range(self.processes):
            wait_for(lambda: not warm.empty() or pending.ready(), DRAIN_SECONDS, what="handlers")
            if pending.ready():
                pending.get()  # a handler process failed: raises its error
            warm_ids.update(warm.get())
        wait_for(lambda: ran.has(warm_ids), DRAIN_SECONDS, what=f"{system}'s first tasks to run")
        log(f"{system}: warm")
        tree = postgres_probe(self.conn)
        own = [self.sampler.pid, self.conn.info.backend_pid]
        cpu = PostgresCpu(tree, own) if tree is not None else None
        with self.sampler.sampling():
            barrier.wait(timeout=DRAIN_SECONDS)
            began = time.time()
            stalled = None
            if stall and self.postmaster is not None:
                stalled = Stall(self.postmaster, max(0.2, (seconds - stall) / 2), stall)
            requests: list[Request] = [r for done in pending.get() for r in done]
            if stalled is not None:
                stalled.join()
            enqueued = time.time()
            waits, connections = dict(self.sampler.waits), self.sampler.peak_connections
        acknowledged = {got for _, _, got, _ in requests if got is not None}
        log(f"{system}: {len(requests)} requests sent")
        drained = wait_for(lambda: ran.has(acknowledged), DRAIN_SECONDS + seconds, poll=0.1)
        cpu_seconds = cpu.seconds() if cpu is not None else None
        whole = time.time() - began  # the CPU's window: to the last task's start
        window = max(seconds, enqueued - began)
        started = [ran.tasks[t] for t in acknowledged if t in ran.tasks]
        quiet = [ms for tenant, ms in started if int(tenant[1:]) >= QUIET_RANK]
        failures = Counter(error for _, _, _, error in requests if error is not None)
        figures: dict[str, Any] = {
            "offered_per_s": rate,
            "achieved_per_s": round(len(acknowledged) / window, 1),
            "requests": len(requests),
            "handler_ms": _ms([ms for _, ms, _, _ in requests], "p50", "p99", "p999", "max"),
            "postgres_cpu_us_per_task": None
            if cpu_seconds is None or not acknowledged
            else round(cpu_seconds * 1e6 / len(acknowledged), 1),
            "postgres_cores": None if cpu_seconds is None else round(cpu_seconds / whole, 2),
            "postgres_connections": connections,
            "wait_events": dict(sorted(waits.items(), key=lambda kv: (-kv[1], kv[0]))),
            "start_ms": _ms([ms for _, ms in started], "p50", "p99"),
            "quiet_tenants_start_ms": _ms(quiet, "p50", "p99"),
            "acknowledged": len(acknowledged),
            "ran": len(started),
            "lost": len(acknowledged) - len(started),
            "failed": sum(failures.values()),
            "errors": dict(failures),
            "drained": drained,
        }
        if stalled is not None:
            during = [
                r for r in requests if r[0] < stalled.ended and r[0] + r[1] / 1000 > stalled.began
            ]
            figures["stall"] = {
                "seconds": round(stalled.ended - stalled.began, 2),
                "requests": len(during),
                "handler_ms": _ms([ms for _, ms, _, _ in during], "p50", "p99", "max"),
                "failed": sum(1 for r in during if r[3] is not None),
                "errors": dict(Counter(r[3] for r in during if r[3] is not None)),
                "lost": figures["lost"],
            }
        return figures


def _system(
    bench: Bench,
    system: str,
    rate: float,
    seconds: float,
    stall_seconds: float,
    sweep_rates: Sequence[float],
    sweep_seconds: float,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A system's run, its stalled run and its sweep: its figures, and the sweep's."""
    log(f"{system}: starting its consumers")
    with _consumers(system, bench.settings, bench.conn) as (url, ran):
        figures = bench.run(system, url, ran, rate, seconds)
        if stall_seconds and bench.postmaster is not None:
            length = max(seconds, stall_seconds + 2)
            stalled = bench.run(system, url, ran, rate, length, stall_seconds)
            figures["stall"] = {**stalled.pop("stall"), "run": stalled}
        else:
            figures["stall"] = None
        runs, best = [], 0.0
        for offered in sorted(sweep_rates):
            run = bench.run(system, url, ran, offered, sweep_seconds)
            passed = (
                run["handler_ms"]["p99"] <= P99_GOAL_MS
                and run["lost"] == 0
                and run["failed"] == 0
                and run["achieved_per_s"] >= 0.9 * offered
            )
            runs.append(
                {
                    "offered_per_s": offered,
                    "achieved_per_s": run["achieved_per_s"],
                    "handler_p99_ms": run["handler_ms"]["p99"],
                    "lost": run["lost"],
                    "failed": run["failed"],
                    "passed": passed,
                }
            )
            if not passed:
                break  # a higher rate does no better
            best = offered
    return figures, {"rate_per_s": best, "runs": runs}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else ratio(a, b)


def ratios(systems: dict[str, Any], sweep: dict[str, Any]) -> dict[str, float | None]:
    """rota's figures over rota_direct's and over the best of its peers'."""
    rota = systems.get("rota")
    if rota is None:
        return {}
    peers = [systems[p] for p in PEERS if p in systems]
    cpu = [p["postgres_cpu_us_per_task"] for p in peers if p["postgres_cpu_us_per_task"]]
    direct = systems.get("rota_direct")
    swept = [sweep[p]["rate_per_s"] for p in PEERS if p in sweep and sweep[p]["runs"]]
    rota_cpu, rota_p99 = rota["postgres_cpu_us_per_task"], rota["handler_ms"]["p99"]
    return {
        "postgres_cpu_to_rota_direct": _ratio(
            rota_cpu, direct["postgres_cpu_us_per_task"] if direct else None
        ),
        "postgres_cpu_to_best_peer": _ratio(rota_cpu, min(cpu, default=None)),
        "handler_p99_to_best_peer": _ratio(
            rota_p99, min((p["handler_ms"]["p99"] for p in peers), default=None)
        ),
        "sweep_rate_to_best_peer": _ratio(
            sweep["rota"]["rate_per_s"] if sweep.get("rota", {}).get("runs") else None,
            max(swept, default=None),
        ),
    }


def bench_fleet(
    settings: Settings,
    processes: int,
    threads: int,
    rate: float,
    seconds: float,
    stall_seconds: float,
    systems: Sequence[str],
    sweep_rates: Sequence[float],
    sweep_seconds: float,
) -> dict[str, Any]:
    """Every system in turn on the same servers (the module's docstring)."""
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        row = conn.execute(query("bench_fleet_max_connections")).fetchone()
        needed = processes * threads + 50
        if row is None or row[0] < needed:
            raise RuntimeError(
                f"benchmark: {processes}x{threads} handlers need max_connections >= {needed} "
                f"(the server has {row[0] if row else '?'})"
            )
        fields = proc_stat(conn.info.backend_pid)
        postmaster = int(fields[1]) if postgres_probe(conn) is not None and fields else None
        notes = []
        if postmaster is None:
            notes.append("PostgreSQL is not on this machine: no CPU figures and no stall")
        ctx = multiprocessing.get_context("spawn")
        sampler = Sampler(settings.database_url, [conn.info.backend_pid])
        try:
            with warm_pool(processes, initializer=None) as pool, ctx.Manager() as manager:
                bench = Bench(
                    settings, conn, pool, manager, sampler, postmaster, processes, threads, notes
                )
                figures, sweep = {}, {}
                for system in systems:
                    figures[system], sweep[system] = _system(
                        bench, system, rate, seconds, stall_seconds, sweep_rates, sweep_seconds
                    )
        finally:
            sampler.close()
    return {
        "params": {
            "handlers": f"{processes}x{threads}",
            "handler_processes": processes,
            "handler_threads": threads,
            "offered_per_s": rate,
            "seconds": seconds,
            "stall_seconds": stall_seconds,
            "sweep_rates": list(sweep_rates),
            "sweep_seconds": sweep_seconds,
            "tenants": TENANTS,
            "zipf_exponent": ZIPF_EXPONENT,
            "consumers": CONSUMERS,
        },
        "systems": figures,
        "sweep": sweep,
        "ratios": ratios(figures, sweep),
        "goal": {
            "postgres_cpu_to_rota_direct_at_most": 0.15,
            "postgres_cpu_to_best_peer_at_most": 0.5,
            "handler_p99_to_best_peer_at_most": 0.5,
            "sweep_rate_to_best_peer_at_least": 2.0,
            "rota_lock_wait_samples": 0,
            "rota_stall_handler_max_ms_at_most": 10,
        },
        "notes": notes,
        "method": {
            "postgres_cpu": "the postmaster's process tree from /proc: every process alive at "
            "either end of the window, and the backends that exited meanwhile (the kernel adds "
            "a reaped child's CPU to its parent's children's times); less the bench's own two "
            "backends (sampler, waiting for the tasks); from the first request to the last "
            "task of the run started, per acknowledged task",
            "handler_ms": "the enqueue call of each request, timed in its handler thread",
            "wait_events": f"pg_stat_activity every {SAMPLE_SECONDS * 1000:g} ms while the "
            "handlers ran: non-idle client backends by wait event (CPU: none), background "
            "processes when not waiting for work",
        },
    }
