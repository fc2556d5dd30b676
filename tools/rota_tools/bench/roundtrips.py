"""Round trips on a task's way from enqueue to start, counted on the wire.

Each process of the pipeline reaches its servers through a recording proxy
of its own (rota_tools.delay_proxy, no delay added): the producer's Redis,
the loader's Redis and PostgreSQL, the worker's PostgreSQL. Tasks then go
through one at a time, each after the last has finished, so that every
exchange seen belongs to the task in flight. A round trip is a request (what
a client sends after the server last spoke) and the answer to it; what a
server sends unasked (a NOTIFY) is no round trip. For each task:

- producer: round trips sent between the enqueue call and its return;
- loader: those answered after the enqueue call, up to the commit whose
  NOTIFY wakes the worker: the last answer on the load's connection to a
  request sent before that NOTIFY reached the worker (without one, before
  the worker's first request); the blocked read that the new entry ends
  counts as one, and what follows the commit (the WAL flush, on a
  connection of its own, before the buffer is acknowledged) does not;
- worker: those sent from its first request after that NOTIFY (without
  one, after the enqueue call) and answered by the task's start: the claim;
  an idle poll or a heartbeat sent while the task was still on its way, or
  the report sent as the task ends, is not on its path.

One worker, so that no idle worker's claim stands among them. Exchanges off
the path (an acknowledgement after the commit, a heartbeat) fall outside the
windows or into the odd task only; the figures are medians.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from rota import Settings
from rota.core import db
from rota_tools.bench.harness import NOOP_APP, QUEUE, bench_app, reset, wait_for_finished
from rota_tools.delay_proxy import Chunk, DelayProxy
from rota_tools.devservers import free_port
from rota_tools.processes import spawn_loader, spawn_workers, stop_workers
from rota_tools.sql import query

LOOPBACK = "127.0.0.1"


class Trip(NamedTuple):
    sent: float
    answered: float
    connection: int = 0  # the proxy's number for the connection it went on


def trips(events: list[Chunk]) -> list[Trip]:
    """The round trips in a proxy's chunks, over all its connections."""
    found: list[Trip] = []
    open_request: dict[int, float] = {}
    for chunk in sorted(events):
        if chunk.from_client:
            open_request.setdefault(chunk.connection, chunk.at)
        elif chunk.connection in open_request:
            found.append(Trip(open_request.pop(chunk.connection), chunk.at, chunk.connection))
    return found


def notified(events: list[Chunk]) -> list[float]:
    """When a PostgreSQL proxy's server side sent a NOTIFY (a chunk that
    begins a NotificationResponse, unasked)."""
    return sorted(c.at for c in events if not c.from_client and c.head == b"A")


class Path(NamedTuple):
    producer: int
    loader: int
    worker: int

    @property
    def total(self) -> int:
        return self.producer + self.loader + self.worker


def path_of(
    enqueued: float,
    acknowledged: float,
    started: float,
    producer: list[Trip],
    loader: list[Trip],
    loader_postgres: list[Trip],
    worker: list[Trip],
    notifies: Sequence[float] = (),
) -> Path | None:
    """One task's round trips per stage (the module's docstring says how);
    None when no worker request came between the enqueue and the start."""
    # Answered by the start: a report sent just after it is not on the path
    # (the start recorded is the worker's measure added to the claim's time,
    # up to a one-way trip late). A worker's request before the NOTIFY (an
    # idle poll, a heartbeat) could not have found the task: its path begins
    # with the first after it.
    claims = [t for t in worker if enqueued <= t.sent and t.answered <= started]
    notify = next((at for at in notifies if enqueued < at <= started), None)
    woken_claims = [t for t in claims if notify is not None and t.sent >= notify]
    if woken_claims:
        claims = woken_claims
    else:
        notify = None
    if not claims:
        return None
    woken = min(t.sent for t in claims)
    # The load's statements go on one connection, the first answered after
    # the enqueue; the flush that follows its commit goes on another (the
    # acknowledgements' own), sent once the commit is answered, and may be
    # sent before the NOTIFY reaches a worker slow to be told.
    answered = [t for t in loader_postgres if enqueued < t.answered]
    if not answered:
        return None
    loading = min(answered, key=lambda t: t.answered).connection
    commits = [
        t.answered
        for t in answered
        if t.connection == loading and (t.answered <= woken if notify is None else t.sent < notify)
    ]
    if not commits:
        return None
    committed = max(commits)
    return Path(
        producer=sum(enqueued <= t.sent <= acknowledged for t in producer),
        loader=sum(enqueued < t.answered <= committed for t in loader),
        worker=len(claims),
    )


def _via(url: str, port: int) -> str:
    """A PostgreSQL URL (or conninfo) that goes to the loopback `port`."""
    return make_conninfo(url, host=LOOPBACK, hostaddr="", port=str(port))


def _redis_via(url: str, port: int) -> str:
    parts = urllib.parse.urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@{LOOPBACK}:{port}" if user else f"{LOOPBACK}:{port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _postgres_address(url: str) -> tuple[str, int]:
    params = conninfo_to_dict(url)
    return str(params.get("host") or LOOPBACK), int(params.get("port") or 5432)


def _redis_address(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or LOOPBACK, parts.port or 6379


@contextlib.contextmanager
def _proxies(settings: Settings) -> Iterator[dict[str, DelayProxy]]:
    targets = {
        "producer": _redis_address(settings.redis_url),
        "loader_redis": _redis_address(settings.redis_url),
        "loader_postgres": _postgres_address(settings.database_url),
        "worker_postgres": _postgres_address(settings.database_url),
        "worker_redis": _redis_address(settings.redis_url),
    }
    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(DelayProxy((LOOPBACK, free_port()), target, record=True))
            for name, target in targets.items()
        }


def start_round_trips(settings: Settings, tasks: int = 40) -> dict[str, Any]:
    """Round trips on the way from enqueue to start (the module's docstring),
    medians over `tasks` tasks sent one at a time."""
    with _proxies(settings) as proxy, db.connect(settings.database_url) as conn:
        reset(conn)
        port = {name: p.listen[1] for name, p in proxy.items()}

        def through(process: str) -> Settings:
            """The settings of `process` ("loader" or "worker"): its own proxies."""
            database = _via(settings.database_url, port[f"{process}_postgres"])
            redis = _redis_via(settings.redis_url, port[f"{process}_redis"])
            update = {"database_url": database, "redis_url": redis, "direct_database_url": None}
            return settings.model_copy(update=update)

        producer = _redis_via(settings.redis_url, port["producer"])
        app = bench_app(settings.model_copy(update={"redis_url": producer}))
        noop = app.tasks["noop"]
        loader = spawn_loader(through("loader"))
        workers = spawn_workers(NOOP_APP, [QUEUE], 1, through("worker"), batch_size=100)
        processes = [loader, *workers]
        sent: list[tuple[Any, float, float]] = []
        try:
            for warm in range(3):  # connections made, statements prepared
                noop.using(tenant="warm-up").enqueue(-1, "warm-up")
                wait_for_finished(conn, warm + 1, processes)
            for i in range(tasks):
                enqueued = time.time()
                task_id = noop.using(tenant=f"t{i % 10}").enqueue(i, "pad")
                sent.append((task_id, enqueued, time.time()))
                wait_for_finished(conn, 4 + i, processes)
        finally:
            stop_workers(processes)
            app.close()
        started = dict(
            conn.execute(
                query("bench_started_epochs"), {"ids": [task_id for task_id, _, _ in sent]}
            ).fetchall()
        )
    seen = {name: trips(p.events or []) for name, p in proxy.items()}
    worker = seen["worker_postgres"] + seen["worker_redis"]
    paths = [
        path
        for task_id, enqueued, acknowledged in sent
        if (
            path := path_of(
                enqueued,
                acknowledged,
                float(started[task_id]),
                seen["producer"],
                seen["loader_redis"] + seen["loader_postgres"],
                seen["loader_postgres"],
                worker,
                notified(proxy["worker_postgres"].events or []),
            )
        )
        is not None
    ]
    if not paths:
        raise RuntimeError("round trips: no task's path was seen whole")

    def median(values: list[int]) -> float:
        return float(statistics.median(values))

    return {
        "tasks": len(paths),
        "producer": median([p.producer for p in paths]),
        "loader": median([p.loader for p in paths]),
        "worker": median([p.worker for p in paths]),
        "total": median([p.total for p in paths]),
        "total_max": max(p.total for p in paths),
    }
