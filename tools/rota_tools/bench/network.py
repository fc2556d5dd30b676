"""`rota bench chaos --network`: network faults under load, and the chaos
suite's history check (rota_tools.bench.faults).

Where the chaos suite's faults end connections at once (the peer resets),
here every process runs in a network namespace of its own and reaches the
servers through links of its own (rota_tools.netns), and the faults are on
those links: silent partitions (no reset) shorter and longer than a lease,
a half-open connection (the worker's sessions ended behind a partition), a
slow link (tc tbf) and added latency through a proxy of the suite's own
(rota_tools.delay_proxy: this kernel has no netem). Per fault: when the
process noticed (its log's "unavailable" line), and how soon after the
link came back the pipeline was at 90% of its baseline throughput.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from rota.core import db
from rota_tools.bench.faults import LOADER, WORKER, Fault, Fleet, history_report, prepare_database
from rota_tools.delay_proxy import DelayProxy
from rota_tools.devservers import free_port, local_postgres, local_redis
from rota_tools.netns import Host, TestNetwork

# Each process takes a link that hears nothing for this long for dead.
DEAD_LINK_SECONDS = 6.0
# The latency fault: added to each chunk, each way, on this process's way to
# PostgreSQL, which goes through the delay proxy from the start.
DELAYED = "loader"
ADDED_LATENCY_SECONDS = 0.1
_UNAVAILABLE = re.compile(r"^(\S+ \S+) \S+ .*unavailable, reconnecting")


class NetworkFleet(Fleet):
    """The chaos fleet with each process in a namespace of its own."""

    def __init__(self, workdir: Path, pg: Any, rd: Any, net: TestNetwork):
        super().__init__(workdir, pg, rd)
        self.net = net
        self.hosts: dict[str, Host] = {}
        # Per process, settings of its own (DELAYED's database, behind the proxy).
        self.own_env: dict[str, dict[str, str]] = {}
        pg_at, redis_at = net.servers["postgres"], net.servers["redis"]
        self.env = {
            **self.env,
            "ROTA_DATABASE_URL": f"postgresql://rota@{pg_at}:{pg.port}/postgres",
            "ROTA_REDIS_URL": f"redis://{redis_at}:{rd.port}/0",
            "ROTA_DATABASE_DEAD_LINK_SECONDS": str(DEAD_LINK_SECONDS),
        }

    def launch(self, name: str) -> tuple[list[str], dict[str, str], Path | None]:
        if name not in self.hosts:
            self.hosts[name] = self.net.host(name)
        command = self.hosts[name].command(self.processes[name].command)
        return command, {**self.env, **self.own_env.get(name, {})}, None

    def detected_after(self, name: str, since: float) -> float | None:
        """Seconds from `since` to the process's first outage line after it."""
        for line in self.processes[name].log.read_text(errors="replace").splitlines():
            match = _UNAVAILABLE.match(line)
            if match:
                at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                if at >= since - 0.05:
                    return round(at - since, 1)
        return None


def _let_hosts_in(pg: Any) -> None:
    """PostgreSQL lets the test network's hosts in (it listens there already)."""
    hba = Path(pg.directory) / "data" / "pg_hba.conf"
    with hba.open("a") as rules:
        rules.write("host all all 10.0.0.0/8 trust\n")
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("SELECT pg_reload_conf()")


def run_network_chaos(
    *,
    rate: float = 100.0,
    seconds_per_task: float = 0.02,
    baseline_seconds: float = 10.0,
    settle_seconds: float = 12.0,
    short_seconds: float = 3.0,
    long_seconds: float = 12.0,
) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        net = stack.enter_context(TestNetwork())
        pg_at, redis_at = net.serve("postgres"), net.serve("redis")
        # A link of each host's that no fault touches: this machine asks the
        # console over it.
        net.serve("operator")
        slow_pg_at = net.serve("postgres-delayed")
        pg = stack.enter_context(local_postgres({"listen_addresses": f"127.0.0.1,{pg_at}"}))
        rd = stack.enter_context(local_redis(also_on=[redis_at]))
        proxy = stack.enter_context(DelayProxy((slow_pg_at, free_port()), ("127.0.0.1", pg.port)))
        _let_hosts_in(pg)
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rota-net-")))
        prepare_database(pg.url)
        fleet = NetworkFleet(workdir, pg, rd, net)
        fleet.own_env[DELAYED] = {
            "ROTA_DATABASE_URL": f"postgresql://rota@{slow_pg_at}:{proxy.listen[1]}/postgres"
        }
        with fleet:
            fleet.add("loader", *LOADER)
            fleet.add("worker1", *WORKER, "--no-maintenance")
            fleet.add("worker2", *WORKER, "--no-maintenance")
            fleet.add("maintenance", "maintenance")
            fleet.add("maintenance2", "maintenance")  # takes over while the first is cut off
            fleet.add_producer(rate, seconds_per_task)
            console = Console(fleet)
            fleet.started(90)
            assert fleet.wait(console.answers, 60), "the console did not start"
            fleet.measure_baseline(baseline_seconds)
            return _run(fleet, console, proxy, rate, settle_seconds, short_seconds, long_seconds)


def _run(
    fleet: NetworkFleet,
    console: Console,
    proxy: DelayProxy,
    rate: float,
    settle_seconds: float,
    short_seconds: float,
    long_seconds: float,
) -> dict[str, Any]:
    """The faults, one after another under load, and the report."""
    net = fleet.net
    detection: dict[str, float | None] = {}
    always_up = True
    down: set[str] = set()

    def note_down() -> bool:
        gone = {name for name, up in fleet.alive().items() if not up}
        down.update(gone)
        return not gone

    def over(name: str, started: float, ended: float) -> None:
        """A fault has ended: recorded; then the pipeline's recovery awaited
        and every process checked still up."""
        nonlocal always_up
        fleet.fault(Fault(name, started, ended, "network"), settle_seconds)
        always_up = note_down() and always_up

    def partition(name: str, process: str, servers: list[str], seconds: float, watch: bool) -> None:
        host = fleet.hosts[process]
        started = time.time()
        for server in servers:
            net.partition(host, _way(process, server))
        time.sleep(seconds)
        for server in servers:
            net.heal(host, _way(process, server))
        ended = time.time()
        over(name, started, ended)
        if watch:
            detection[name] = fleet.detected_after(process, started)

    def half_open(process: str) -> None:
        host = fleet.hosts[process]
        started = time.time()
        net.partition(host, "postgres")
        address = host.links["postgres"].host_end  # its sessions come from the link's far end
        with db.connect(fleet.settings.database_url) as conn:
            far = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE host(client_addr) LIKE %s",
                [_far_prefix(net, address)],
            ).fetchall()
        time.sleep(1.0)
        net.heal(host, "postgres")
        ended = time.time()
        over(f"half-open: {process}'s {len(far)} sessions", started, ended)
        # Noticed at its next use of the connection, once the link is back.
        detection[fleet.faults[-1].name] = fleet.detected_after(process, started)

    def slow(processes: list[str], seconds: float) -> None:
        started = time.time()
        links = [fleet.hosts[p].links[_way(p, "postgres")].host_end for p in processes]
        for link in links:
            _tc("qdisc", "add", "dev", link, "root", "tbf", "rate", "256kbit",
                "burst", "16kbit", "latency", "200ms")  # fmt: skip
        time.sleep(seconds)
        for link in links:
            _tc("qdisc", "del", "dev", link, "root")
        ended = time.time()
        over(f"slow link (256 kbit/s): {', '.join(processes)}", started, ended)

    def latency(seconds: float) -> dict[str, Any]:
        """Adds latency on DELAYED's way to PostgreSQL (it must carry on,
        slower, and never take the link for dead)."""
        started = time.time()
        proxy.delay = ADDED_LATENCY_SECONDS
        time.sleep(seconds)
        proxy.delay = 0.0
        ended = time.time()
        over(f"latency +{ADDED_LATENCY_SECONDS * 1000:g} ms each way: {DELAYED} to postgres",
             started, ended)  # fmt: skip
        return {
            "added_each_way_ms": ADDED_LATENCY_SECONDS * 1000,
            "seconds": round(ended - started, 1),
            # Tasks loaded through the late link ran meanwhile: those that
            # started a second or more into it (there is no backlog at this
            # rate: what ran then was loaded then).
            "runs_started_meanwhile": sum(
                1 for run in fleet.runs() if started + 1 <= run.start and run.end < ended
            ),
            "taken_for_dead_after_s": fleet.detected_after(DELAYED, started),
        }  # fmt: skip

    short, long = short_seconds, long_seconds
    for process, servers, seconds, watch, note in [
        ("worker1", ["postgres"], short, False, ""),
        ("loader", ["postgres"], short, False, ""),
        ("loader", ["redis"], short, False, ""),
        ("producer", ["redis"], short, False, ""),
        ("worker1", ["postgres"], long, True, " (past a lease)"),
        ("loader", ["postgres"], long, True, ""),
        ("loader", ["redis"], long, True, ""),
        ("producer", ["redis"], long, False, ""),
        ("producer", ["redis", "postgres"], short, False, ""),
        ("maintenance", ["postgres"], long, True, ""),
    ]:
        to = "both" if len(servers) > 1 else servers[0]
        partition(f"{process} ⟂ {to} {seconds:g} s{note}", process, servers, seconds, watch)
    console_fault = console.cut_off(long_seconds)
    half_open("worker2")
    slow(["loader", "worker2"], short_seconds * 2)
    latency_fault = latency(short_seconds * 2)
    report = history_report(fleet, time.time(), 0, always_up, rate)
    report["dead_link_seconds"] = DEAD_LINK_SECONDS
    report["detected_after_s"] = detection
    report["processes_down"] = sorted(down)
    report["console"] = console_fault
    report["latency"] = latency_fault
    return report


CONSOLE_TOKEN = "network-suite-token-0123"


class Console:
    """`rota dashboard` in a host of its own, asked from this machine over
    the link's far address, with a token (it is not on loopback)."""

    def __init__(self, fleet: NetworkFleet) -> None:
        self.fleet = fleet
        self.port = 8377
        fleet.env = {**fleet.env, "ROTA_DASHBOARD_TOKEN": CONSOLE_TOKEN}
        host = fleet.hosts["console"] = fleet.net.host("console")
        self.address = _far_prefix(fleet.net, host.links["operator"].host_end)
        fleet.add(
            "console", "dashboard", "--host", "0.0.0.0", "--port", str(self.port),
            "--allowed-host", self.address,
        )  # fmt: skip

    def ask(self, path: str, timeout: float) -> tuple[float, int | None]:
        """(seconds the answer took, its status; None: no answer)."""
        import httpx

        started = time.monotonic()
        try:
            answer = httpx.get(
                f"http://{self.address}:{self.port}{path}",
                headers={"Authorization": f"Bearer {CONSOLE_TOKEN}"},
                timeout=timeout,
            )
            status: int | None = answer.status_code
        except httpx.HTTPError:
            status = None
        return time.monotonic() - started, status

    def answers(self) -> bool:
        # The tenants' list reads PostgreSQL on every call.
        return self.ask("/api/tenants", 5)[1] == 200

    def cut_off(self, seconds: float) -> dict[str, Any]:
        """Partitions the console from both servers: how long a page that
        reads PostgreSQL takes meanwhile and what it answers (503: a server
        is unavailable), and how soon it is whole again."""
        net, host = self.fleet.net, self.fleet.hosts["console"]
        for server in ("postgres", "redis"):
            net.partition(host, server)
        time.sleep(1)
        took, status = self.ask("/api/tenants", timeout=60)
        time.sleep(max(0.0, seconds - 1 - took))
        for server in ("postgres", "redis"):
            net.heal(host, server)
        healed = time.monotonic()
        whole = self.fleet.wait(self.answers, 30, poll=0.2)
        return {
            "partition_seconds": seconds,
            "page_during_partition_s": round(took, 1),
            "status_during_partition": status,
            "whole_again_after_s": round(time.monotonic() - healed, 1) if whole else None,
        }


def _way(process: str, server: str) -> str:
    """The link a process reaches a server by: DELAYED reaches PostgreSQL
    through the delay proxy's address."""
    return "postgres-delayed" if (process, server) == (DELAYED, "postgres") else server


def _far_prefix(net: TestNetwork, host_end: str) -> str:
    """The address pattern of a link's namespace end, for pg_stat_activity."""
    pair = int(host_end.rsplit("h", 1)[1])
    return f"{net.prefix}.{pair}.2"


def _tc(*args: str) -> None:
    subprocess.run(["tc", *args], check=True, capture_output=True)
