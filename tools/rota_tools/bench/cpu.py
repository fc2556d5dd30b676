"""Where a benchmark's CPU went: seconds per process over a measured window.

Local processes by their CPU clocks (every thread), PostgreSQL as its
postmaster and every child, exited ones included (/proc); Redis reports its
own (INFO cpu), so it is measured wherever it runs.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from rota.buffer import redis_client
from rota_tools.devservers import descendants, proc_stat

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_LIBC = ctypes.CDLL(None, use_errno=True)
LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "::1"}

Probe = Callable[[], float | None]


def _cpu_clock_seconds(pid: int) -> float | None:
    """A process's CPU clock (clock_getcpuclockid): every thread's time,
    exited ones included, in nanoseconds, as seconds. Clock ticks (10 ms,
    /proc/PID/stat) round a small process's share to nothing, and
    /proc/PID/schedstat is its main thread's alone (a worker runs its tasks
    in a pool's threads). None if the process is gone or the clock cannot be
    read."""
    clock = ctypes.c_int()
    if _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
        return None
    try:
        return time.clock_gettime(clock.value)
    except OSError:
        return None


def process_seconds(pid: int, *, with_exited_children: bool = False) -> float | None:
    """CPU seconds (user + system) a process has used, every thread of it;
    with its children that have exited and been waited for, when asked.
    None if it is gone."""
    fields = proc_stat(pid)
    if fields is None:
        return None
    # From the state (field 3): utime is field 14, stime 15, cutime 16, cstime 17.
    seconds = _cpu_clock_seconds(pid)
    if seconds is None:
        seconds = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    if with_exited_children:
        seconds += (int(fields[13]) + int(fields[14])) / CLOCK_TICKS
    return seconds


def _reaped_ticks(pid: int) -> int | None:
    """The clock ticks of a process's children that have exited and been
    waited for (cutime + cstime); None if it is gone."""
    fields = proc_stat(pid)
    return None if fields is None else int(fields[13]) + int(fields[14])


# Reads of a tree that a child's end spoilt, before the last is taken as is.
TREE_READS = 5


def process_tree_seconds(pid: int) -> float | None:
    """A process tree's CPU seconds: the process's, and every process's
    below it (a server's backends, a Spark driver's JVM with its Python
    daemon and workers), those that have exited and been waited for
    included (PostgreSQL's backends come and go). A read is one state of
    the tree: a child that ends and is waited for while the tree is read
    would count nowhere (gone when read, not yet among the waited-for) or
    twice, its whole life's CPU, so such a read is made again."""
    total: float | None = None
    for _ in range(TREE_READS):
        reaped = _reaped_ticks(pid)
        own = process_seconds(pid)
        below = [process_seconds(p, with_exited_children=True) for p in descendants(pid)]
        if reaped is None or own is None:
            return None
        total = own + reaped / CLOCK_TICKS + sum(seconds or 0.0 for seconds in below)
        if None not in below and _reaped_ticks(pid) == reaped:
            break
    return total


def machine_seconds() -> float:
    """CPU seconds the whole machine has been busy, every core (/proc/stat:
    user, nice, system, irq, softirq; idle, iowait and steal left out)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / CLOCK_TICKS


def tree_probe(pid: int) -> Probe:
    """A probe of a process tree's CPU (`process_tree_seconds`)."""
    return lambda: process_tree_seconds(pid)


def postgres_probe(conn: psycopg.Connection[Any]) -> Probe | None:
    """A probe of the PostgreSQL server's CPU (every process of it), or None
    when the server is not on this machine (its pids mean nothing here)."""
    host = str(conninfo_to_dict(conn.info.dsn).get("host", ""))
    if host.split(",")[0] not in LOCAL_HOSTS and not host.startswith("/"):
        return None
    backend = conn.info.backend_pid
    fields = proc_stat(backend)
    if fields is None or Path(f"/proc/{backend}/comm").read_text().strip() != "postgres":
        return None
    postmaster = int(fields[1])
    return tree_probe(postmaster)


def redis_probe(client: redis_client.Client) -> Probe:
    """Redis's CPU seconds, as it reports them (its forks' included)."""

    def seconds() -> float | None:
        info: Any = client.info("cpu")
        keys = ("used_cpu_sys", "used_cpu_user", "used_cpu_sys_children", "used_cpu_user_children")
        return float(sum(info.get(key, 0.0) for key in keys))

    return seconds


def pid_probe(pid: int) -> Probe:
    return lambda: process_seconds(pid)


class CpuMeter:
    """Samples named probes at the start and end of a window."""

    def __init__(self, probes: Mapping[str, Probe | None]) -> None:
        self.probes = {name: probe for name, probe in probes.items() if probe is not None}
        self.absent = sorted(name for name, probe in probes.items() if probe is None)
        self.before: dict[str, float | None] = {}

    def start(self) -> None:
        self.before = {name: probe() for name, probe in self.probes.items()}

    def report(
        self, elapsed: float, tasks: int | None = None, also: Mapping[str, float] | None = None
    ) -> dict[str, Any]:
        """Per process: CPU seconds in the window, and cores (seconds per
        second of the window); with the window's `tasks`, microseconds of CPU
        per task too, which compare across rates. The machine's cores beside
        them. `also`: the seconds of processes that timed themselves (a
        pool's, by time.process_time)."""
        spent = {name: self._spent(name, probe) for name, probe in self.probes.items()}
        spent.update(also or {})
        used: dict[str, dict[str, float]] = {}
        total = 0.0  # of the unrounded seconds, which the per-task figures use too
        for name, seconds in spent.items():
            if seconds is None:
                continue
            total += seconds
            # To the tenth of a millisecond: a proxy's share of a short run is
            # a few milliseconds.
            used[name] = {"seconds": round(seconds, 4), "cores": round(seconds / elapsed, 2)}
            if tasks:
                used[name]["us_per_task"] = round(seconds / tasks * 1e6, 1)
        per_task = {"all_us_per_task": round(total / tasks * 1e6, 1)} if tasks else {}
        return {
            "per_process": used,
            "all_cores": round(total / elapsed, 2),
            **per_task,
            "machine_cores": os.cpu_count(),
            "busiest": max(used, key=lambda name: used[name]["seconds"], default=None),
            "not_measured": self.absent,
        }

    def _spent(self, name: str, probe: Probe) -> float | None:
        start, end = self.before.get(name), probe()
        return None if start is None or end is None else end - start


def median_run(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Of CpuMeter reports of several runs, the median run's by all the
    processes' CPU per task."""
    return sorted(reports, key=lambda r: float(r["all_us_per_task"]))[len(reports) // 2]


class PostgresCost:
    """PostgreSQL's CPU (every process of the server: backends, WAL writer,
    autovacuum) and the WAL it wrote over a window, per task: what a primary
    spends per task, whatever the machine it runs on."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        from rota_tools.sql import query

        self.conn = conn
        self.query = query
        self.probe = postgres_probe(conn)
        self.cpu = self.probe() if self.probe else None
        row = conn.execute(query("bench_wal_lsn")).fetchone()
        self.lsn = row[0] if row else None
        try:
            conn.execute(query("bench_statements_reset"))
            self.statements = True
        except psycopg.Error:  # not preloaded (`--statements` starts a server that does)
            self.statements = False

    def per_task(self, tasks: int) -> dict[str, float | None]:
        row = self.conn.execute(self.query("bench_wal_since"), {"lsn": self.lsn}).fetchone()
        wal = int(row[0]) if row else None
        cpu = self.probe() if self.probe else None
        cpu_us = None if cpu is None or self.cpu is None else (cpu - self.cpu) * 1e6 / tasks
        return {
            "cpu_us": None if cpu_us is None else round(cpu_us, 1),
            "wal_bytes": None if wal is None else round(wal / tasks, 1),
        }

    def top_statements(self, tasks: int, limit: int = 6) -> list[dict[str, Any]] | None:
        """pg_stat_statements' busiest statements since the start, per task
        (None without pg_stat_statements)."""
        if not self.statements:
            return None
        rows = self.conn.execute(self.query("bench_statements_top"), {"limit": limit}).fetchall()
        total = sum(float(ms) for _, _, ms in rows) or 1.0
        return [
            {
                "query": text[:120],
                "calls_per_task": round(calls / tasks, 4),
                "exec_us_per_task": round(float(ms) * 1000 / tasks, 2),
                "share_of_these": round(float(ms) / total, 3),
            }
            for text, calls, ms in rows
        ]
