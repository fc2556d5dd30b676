"""The fault suites' shared machinery (`rota bench chaos`, its `--network`
form, and the rolling upgrade): the processes under test and the servers
they use, and the check of the history their tasks left (every
acknowledged id ran, none twice at once, the limits held, duplicates only
near a fault that explains them, nothing left waiting).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Self

import psycopg

from rota import Settings, core
from rota.buffer import redis_client
from rota.buffer.streams import all_streams, dead_letter_stream
from rota.core import db
from rota.core.migrate import migrate
from rota_tools.bench.chaosapp import KEY_LIMIT
from rota_tools.bench.harness import wait_for
from rota_tools.devservers import Server
from rota_tools.sql import query

if TYPE_CHECKING:
    from rota_tools.bench.compare import Side

TENANTS = 50
LIMITED_TENANT = "t0"
LIMIT = 2
LEASE_SECONDS = 5.0
WORKER_DEAD_AFTER = 3.0
MAINTENANCE_SECONDS = 0.2
APP = "rota_tools.bench.chaosapp:app"
PRODUCER = "rota_tools.bench.chaos"  # the module a producer process runs (chaos.produce)
LOADER = ("loader", "run", "--engine", "python")
WORKER = ("worker", "--app", APP, "--concurrency", "4", "--batch-size", "10")


def prepare_database(url: str, migrated: bool = True) -> None:
    """rota's schema (unless `migrated` is False: a process will apply it),
    and LIMITED_TENANT's concurrency limit."""
    with psycopg.connect(url, autocommit=True) as conn:
        if migrated:
            migrate(conn)
        db.transact(conn, core.configure_tenant(LIMITED_TENANT, concurrency_limit=LIMIT))


@dataclass
class Fault:
    name: str
    started: float  # time.time() the fault began
    ended: float  # the server is back, or the process was killed and restarted
    cause: str  # what duplicates near it are put down to
    recovered_after: float | None = None


@dataclass
class Process:
    name: str
    command: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    kills: list[float] = field(default_factory=list)


class Run(NamedTuple):
    """One run of a chaos task, as the task recorded it (rota_tools.bench.chaosapp)."""

    task: str
    tenant: str
    attempt: int
    pid: int  # the worker process that ran it
    start: float
    end: float


class Fleet:
    """The processes under test (each `rota` command or the producer, in a
    process of its own, its output in a log) and the servers they use."""

    def __init__(self, workdir: Path, pg: Server, rd: Server) -> None:
        self.workdir, self.pg, self.rd = workdir, pg, rd
        settings = self.settings = Settings(database_url=pg.url, redis_url=rd.url)
        self.runs_dir = workdir / "runs"
        self.runs_dir.mkdir()
        self.ids_dir = workdir / "ids"
        self.ids_dir.mkdir()
        self.env = {
            **os.environ,
            "ROTA_DATABASE_URL": settings.database_url,
            "ROTA_REDIS_URL": settings.redis_url,
            "ROTA_CHAOS_RUNS": str(self.runs_dir),
            "ROTA_LEASE_SECONDS": str(LEASE_SECONDS),
            "ROTA_HEARTBEAT_SECONDS": "0.5",
            "ROTA_WORKER_DEAD_AFTER_SECONDS": str(WORKER_DEAD_AFTER),
            "ROTA_MAINTENANCE_SECONDS": str(MAINTENANCE_SECONDS),
            "ROTA_POLL_SECONDS": "0.2",
            "ROTA_SHUTDOWN_GRACE_SECONDS": "5",
            "ROTA_LOADER_IDLE_RECLAIM_SECONDS": "2",
            "ROTA_DATABASE_TIMEOUT_SECONDS": "2",
            "ROTA_REDIS_TIMEOUT": "0.5",
            "ROTA_BREAKER_RESET_SECONDS": "1",
        }
        self.processes: dict[str, Process] = {}
        self.pg_stops: list[float] = []
        self.faults: list[Fault] = []
        # Completions a second in the fault-free window (its median), and the window.
        self.baseline, self.baseline_start, self.baseline_end = 0.0, 0.0, 0.0

    def wait(self, condition: Callable[[], bool], timeout: float, poll: float = 0.5) -> bool:
        """Whether `condition` came true within `timeout` (a check that meets
        a server down is not yet true)."""
        return wait_for(condition, timeout, poll=poll, errors=(Exception,))

    def started(self, timeout: float) -> None:
        assert self.wait(lambda: len(self.runs()) > 20, timeout), "the pipeline did not start"

    def measure_baseline(self, seconds: float) -> None:
        self.baseline_start = time.time()
        time.sleep(seconds)  # the window is a length of time, not a condition
        self.baseline_end = time.time()
        per_second = completions_per_second(self.runs(), self.baseline_start, self.baseline_end)
        self.baseline = statistics.median(per_second) if per_second else 0.0

    def recovered(self, since: float) -> bool:
        """Every process is up and some whole second since `since` completed
        at least 90% of the baseline's tasks per second."""
        per_second = completions_per_second(self.runs(), since, time.time())
        return all(self.alive().values()) and any(n >= 0.9 * self.baseline for n in per_second)

    def fault(self, fault: Fault, settle_seconds: float) -> bool:
        """Records a fault that has ended, then keeps the load on until the
        pipeline is back, `settle_seconds` at most; whether every process is up."""
        self.faults.append(fault)
        self.wait(lambda: self.recovered(fault.ended), settle_seconds, poll=0.2)
        return all(self.alive().values())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        for name in list(self.processes):
            self.stop(name, timeout=20)

    def add(self, name: str, *args: str, log: str | None = None) -> None:
        """`rota ARGS`, or for the producer, its rate and seconds per task."""
        runs = [PRODUCER, str(self.ids_dir)] if name == "producer" else ["rota"]
        command = [sys.executable, "-m", *runs, *args]
        self.processes[name] = Process(name, command, self.workdir / f"{log or name}.log")
        self.start(name)

    def add_producer(self, rate: float, seconds_per_task: float) -> None:
        self.add("producer", str(rate), str(seconds_per_task))

    def launch(self, name: str) -> tuple[list[str], dict[str, str], Path | None]:
        """The command, environment and folder a process starts with."""
        return self.processes[name].command, self.env, None

    def start(self, name: str) -> None:
        process = self.processes[name]
        command, env, cwd = self.launch(name)
        with process.log.open("ab") as log:
            process.popen = subprocess.Popen(
                command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT
            )

    def kill(self, name: str) -> None:
        """kill -9, then started again at once."""
        process = self.processes[name]
        assert process.popen is not None
        process.kills.append(time.time())
        process.popen.kill()
        process.popen.wait()
        self.start(name)

    def stop(self, name: str, timeout: float = 60) -> None:
        process = self.processes.pop(name)
        if process.popen is not None and process.popen.poll() is None:
            process.popen.send_signal(signal.SIGTERM)
            try:
                process.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()

    def alive(self) -> dict[str, bool]:
        return {
            n: p.popen is not None and p.popen.poll() is None for n, p in self.processes.items()
        }

    def leader(self) -> str | None:
        """The worker that holds the maintenance lock (its heartbeat
        connection is named after it)."""
        with contextlib.suppress(psycopg.Error), db.connect(self.settings.database_url) as conn:
            row = conn.execute(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                "WHERE l.locktype = 'advisory' AND l.granted "
                "AND a.application_name LIKE 'rota-worker:%%'"
            ).fetchone()
            if row:
                pid = int(row[0].rsplit(":", 2)[-2])
                for name, process in self.processes.items():
                    if process.popen is not None and process.popen.pid == pid:
                        return name
        return None

    def runs(self, kind: str = "runs") -> list[Run]:
        """Every run recorded (`kind` "keyed": those under the limit on keys)."""
        found = []
        for path in self.runs_dir.glob(f"{kind}-*.log"):
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) == 6:
                    task_id, tenant, attempt, pid, start, end = parts
                    found.append(
                        Run(task_id, tenant, int(attempt), int(pid), float(start), float(end))
                    )
        return found

    def acknowledged(self) -> list[str]:
        return [
            line for path in self.ids_dir.glob("*.ids") for line in path.read_text().split() if line
        ]


class UpgradeFleet(Fleet):
    """The chaos fleet, each process run by the version it was started with."""

    def __init__(self, workdir: Path, pg: Any, rd: Any, old: Side) -> None:
        super().__init__(workdir, pg, rd)
        self.old = old
        self.version: dict[str, str] = {}  # process -> "old" or "new"
        self.pid_version: dict[int, str] = {}

    def _run_by(self, version: str) -> tuple[dict[str, str], Path | None]:
        """The environment and folder of `version`'s processes."""
        if version != "old":
            return self.env, None
        return {**self.env, "PYTHONPATH": self.old.env()["PYTHONPATH"]}, self.old.tree

    def launch(self, name: str) -> tuple[list[str], dict[str, str], Path | None]:
        return self.processes[name].command, *self._run_by(self.version[name])

    def start(self, name: str) -> None:
        super().start(name)
        popen = self.processes[name].popen
        assert popen is not None
        self.pid_version[popen.pid] = self.version[name]

    def run_as(self, version: str, name: str, *args: str) -> None:
        self.version[name] = version
        self.add(name, *args, log=f"{name}-{version}")

    def migrate(self, version: str) -> str:
        """`version`'s `rota migrate`; its output (it must succeed)."""
        done = self.run_migrate(version)
        done.check_returncode()
        return done.stdout.strip()

    def run_migrate(self, version: str) -> subprocess.CompletedProcess[str]:
        """`version`'s `rota migrate`, beside the running processes."""
        env, cwd = self._run_by(version)
        command = [sys.executable, "-m", "rota", "migrate"]
        return subprocess.run(command, env=env, capture_output=True, text=True, cwd=cwd)

    def roll(self, rate: float, seconds: float) -> Rolled:
        """The old version's producer, loader and two workers under load;
        the new version's `rota migrate` beside them (its outcome is the
        caller's to judge); then each process replaced by the new version's,
        `seconds` apart."""
        old_migrate = self.migrate("old")
        prepare_database(self.settings.database_url, migrated=False)
        replaced = [
            ("loader", LOADER),
            ("worker1", WORKER),
            ("producer", (str(rate), UPGRADE_SECONDS_PER_TASK)),
            ("worker2", WORKER),
        ]
        for name, args in (*replaced[:2], replaced[3], replaced[2]):  # the producer last
            self.run_as("old", name, *args)
        self.started(120)
        time.sleep(seconds)  # the old pipeline under load for a while
        started = self.baseline_start = self.baseline_end = time.time()
        new_migrate = self.run_migrate("new")
        migrate_seconds = time.time() - started
        time.sleep(seconds)  # the old processes on the new schema
        survived_migration = all(self.alive().values())
        steps = []
        for name, args in replaced:
            self.stop(name)
            self.run_as("new", name, *args)
            steps.append((name, round(time.time() - started, 1)))
            time.sleep(seconds)
        return Rolled(old_migrate, new_migrate, migrate_seconds, survived_migration, steps)


UPGRADE_SECONDS_PER_TASK = "0.02"


class Rolled(NamedTuple):
    """What UpgradeFleet.roll did: both migrations, and when each process
    was replaced (seconds after the new migrate began)."""

    old_migrate: str
    new_migrate: subprocess.CompletedProcess[str]
    migrate_seconds: float
    survived_migration: bool
    replaced: list[tuple[str, float]]


def completions_per_second(runs: list[Run], since: float, until: float) -> list[int]:
    buckets = Counter(int(run.end - since) for run in runs if since <= run.end < until)
    return [buckets.get(i, 0) for i in range(int(until - since))]


def _accepted_attempts(settings: Settings) -> dict[str, int]:
    with db.connect(settings.database_url) as conn:
        rows = conn.execute(query("bench_accepted_attempts")).fetchall()
    return {task_id: int(attempts) for task_id, attempts in rows}


def completion_history(
    accepted: dict[str, int], runs: list[Run]
) -> tuple[list[dict[str, Any]], int]:
    """Finished tasks whose kept end came from an attempt older than the last
    one that started (a completion accepted after its lease had passed: the
    task had been claimed again), each with the runs that show it; and how
    many runs were superseded by a later attempt's. Each run is recorded by
    the task itself (attempt, worker pid, start, end), the kept attempt by
    rota.finished (`accepted`: task id -> attempt)."""
    attempts: defaultdict[str, list[tuple[int, int, float, float]]] = defaultdict(list)
    for task_id, _, attempt, pid, start, end in runs:
        attempts[task_id].append((attempt, pid, start, end))
    stale = [
        {"task": task_id, "accepted_attempt": accepted[task_id], "runs": sorted(found)}
        for task_id, found in attempts.items()
        if task_id in accepted and accepted[task_id] < max(a for a, *_ in found)
    ]
    superseded = sum(
        1
        for task_id, found in attempts.items()
        if task_id in accepted
        for attempt, *_ in found
        if attempt < accepted[task_id]
    )
    return stale, superseded


def left(settings: Settings) -> dict[str, int]:
    """What is still waiting, dead, or dead-lettered (nothing was meant to be)."""
    client = redis_client.connect(settings)
    try:
        streams = all_streams(settings.stream_prefix, settings.shards)
        buffered = sum(int(client.xlen(stream)) for stream in streams)
        dead_letters = int(client.xlen(dead_letter_stream(settings.stream_prefix)))
    finally:
        client.close()
    with db.connect(settings.database_url) as conn:
        counts = db.run(conn, core.queue_counts()).get("chaos", {})
        (dead,) = conn.execute(
            "SELECT count(*) FROM rota.tasks WHERE status = 'dead'"
        ).fetchone() or (0,)
    return {"buffer": buffered, **counts, "dead": int(dead), "dead_letters": dead_letters}


def nothing_left(settings: Settings) -> bool:
    """Nothing waits anywhere: in the buffer, in line, running, scheduled,
    or parked for its key's room."""
    waiting = left(settings)
    return not any(waiting[k] for k in ("buffer", "ready", "running", "scheduled", "parked"))


def _max_concurrent(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


_LEADER = re.compile(r"^(\S+ \S+) rota\.maintenance worker (\S+) (runs the maintenance|lost the)")


def leadership_overlaps(fleet: Fleet) -> int:
    """Intervals in which a worker led, from its log (won ... lost), ended
    also by its kill or by any PostgreSQL stop; overlaps between workers."""
    intervals: list[tuple[float, float, str]] = []
    ends = sorted(fleet.pg_stops)
    for process in fleet.processes.values():
        if not process.name.startswith("worker"):
            continue
        won: dict[str, float] = {}
        for line in process.log.read_text(errors="replace").splitlines():
            match = _LEADER.match(line)
            if not match:
                continue
            at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if match[3].startswith("runs"):
                won[match[2]] = at
            elif match[2] in won:
                intervals.append((won.pop(match[2]), at, match[2]))
        for worker, since in won.items():
            cut = [t for t in [*process.kills, *ends] if t > since]
            intervals.append((since, min(cut) if cut else time.time(), worker))
    intervals.sort()
    overlaps = 0
    for (_, end, who), (start, _, other) in itertools.pairwise(intervals):
        if other != who and start < end - 0.05:  # log timestamps are to the millisecond
            overlaps += 1
    return overlaps


def history_report(
    fleet: Fleet, fault_phase_end: float, leader_overlaps: int, always_up: bool, rate: float
) -> dict[str, Any]:
    """Once the producer is stopped and everything drained (three minutes at
    most), the check of the history the runs left (the module's docstring)."""
    fleet.stop("producer")
    drained = fleet.wait(lambda: nothing_left(fleet.settings), 180)
    remaining = left(fleet.settings)
    runs, faults, baseline = fleet.runs(), fleet.faults, fleet.baseline
    baseline_start, baseline_end = fleet.baseline_start, fleet.baseline_end
    acknowledged = set(fleet.acknowledged())
    by_task: defaultdict[str, list[tuple[float, float]]] = defaultdict(list)
    for task_id, _, _, _, start, end in runs:
        by_task[task_id].append((start, end))
    stale, superseded = completion_history(_accepted_attempts(fleet.settings), runs)
    lost = sorted(acknowledged - set(by_task))
    concurrent_twice = sum(1 for spans in by_task.values() if _max_concurrent(spans) > 1)
    limited = [(s, e) for _, tenant, _, _, s, e in runs if tenant == LIMITED_TENANT]
    keyed = [(s, e) for _, _, _, _, s, e in fleet.runs("keyed")]
    duplicates: Counter[str] = Counter()
    window = LEASE_SECONDS + WORKER_DEAD_AFTER + 2
    for spans in by_task.values():
        first_end = min(end for _, end in spans)
        for _ in spans[1:]:
            # Put down to the latest fault before the first run ended, if it
            # was recent enough to explain a rerun.
            near = [f for f in faults if f.started - 2 <= first_end <= f.ended + window]
            cause = max(near, key=lambda f: f.started).cause if near else "unexplained"
            duplicates[cause] += 1
    completions = completions_per_second(runs, baseline_start, fault_phase_end + 1)
    for f in faults:
        offset = int(f.ended - baseline_start)
        for second in range(max(0, offset), len(completions)):
            if completions[second] >= 0.9 * baseline:
                f.recovered_after = round(max(0.0, second + 1 - (f.ended - baseline_start)), 1)
                break
    fault_seconds = max(1.0, fault_phase_end - baseline_end)
    fault_completions = sum(1 for r in runs if baseline_end <= r.end < fault_phase_end)
    return {
        "params": {
            "rate": rate,
            "tenants": TENANTS,
            "limit": LIMIT,
            "lease_seconds": LEASE_SECONDS,
            "worker_dead_after_seconds": WORKER_DEAD_AFTER,
            "maintenance_seconds": MAINTENANCE_SECONDS,
        },
        "acknowledged": len(acknowledged),
        "ran": len(by_task),
        "lost": len(lost),
        "lost_examples": lost[:5],
        "runs": len(runs),
        "duplicates_by_cause": dict(duplicates),
        "ran_twice_at_once": concurrent_twice,
        # A completion accepted from an attempt that a later one superseded
        # (its lease passed and the task was claimed again): there must be none.
        "stale_completions_accepted": len(stale),
        "stale_completion_examples": stale[:5],
        # Runs that ended but whose completion was not the one kept: their
        # report came past the lease (refused) or never came (a kill).
        "runs_superseded": superseded,
        "limit_violations": max(0, _max_concurrent(limited) - LIMIT)
        + max(0, _max_concurrent(keyed) - KEY_LIMIT),
        "peak_running_of_limited_tenant": _max_concurrent(limited),
        "keyed_runs": len(keyed),
        "peak_running_of_limited_key": _max_concurrent(keyed),
        "key_limit": KEY_LIMIT,
        "maintenance_leader_overlaps": leader_overlaps,
        "processes_stayed_up": always_up,
        "drained": drained,
        "left_at_end": remaining,
        "baseline_tasks_per_s": baseline,
        "throughput_held": round(fault_completions / fault_seconds / baseline, 3)
        if baseline
        else None,
        "faults": [
            {
                "fault": f.name,
                "seconds": round(f.ended - f.started, 1),
                "recovered_to_90pct_after_s": f.recovered_after,
            }
            for f in faults
        ],
    }
