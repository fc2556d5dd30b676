"""Throwaway PostgreSQL and Redis servers for tests, benchmarks and the demo
(and a PgBouncer in front of PostgreSQL, for the tests).

Each server runs from the machine's own binaries (Debian packages, installed by
``infra/install-servers.sh``) on a free loopback port, with its data in a fresh
temporary directory that is removed on stop. No Docker, no system service.

    with local_postgres() as pg, local_redis() as rd:
        print(pg.url, rd.url)

``python -m rota_tools.devservers`` starts both and prints their URLs until
Ctrl-C. (For developing an app, `rota dev` runs them from wheels instead:
rota.runtime.embedded.)
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

# How long an immediate stop may take before the server is killed:
# PostgreSQL's postmaster itself kills children that outlast 5 s of it.
STOP_SECONDS = 30.0


class ServerError(RuntimeError):
    """A throwaway server could not be started."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def postgres_bindir() -> Path:
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda p: int(Path(p).parts[-3]),
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("postgres")
    if found:
        return Path(found).parent
    raise ServerError("PostgreSQL server binaries not found: run `bash infra/install-servers.sh`")


def _as_postgres_user() -> tuple[list[str], int | None, int | None]:
    """initdb refuses to run as root: drop to the `postgres` system user then."""
    if os.geteuid() != 0:
        return [], None, None
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError as exc:
        raise ServerError("running as root but there is no `postgres` user") from exc
    return ["runuser", "-u", "postgres", "--"], entry.pw_uid, entry.pw_gid


def proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields from the third (state) on; None if gone. The
    command name before them may hold spaces and parentheses: they start
    past its last ")"."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def descendants(*roots: int) -> list[int]:
    """Every process below the given ones, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in glob.glob("/proc/[0-9]*"):
        pid = int(Path(entry).name)
        if (fields := proc_stat(pid)) is not None:  # else gone meanwhile
            children.setdefault(int(fields[1]), []).append(pid)  # its parent's
    found, todo = [], list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _dead(pid: int) -> bool:
    """Gone, or a zombie left to reap."""
    fields = proc_stat(pid)
    return fields is None or fields[0] == "Z"


def _until(
    done: Callable[[], bool], timeout: float, failure: Callable[[], str] | None, poll: float = 0.05
) -> None:
    """Polls `done` until it holds. Past `timeout`, raises ServerError with
    `failure()`, or returns when there is no `failure` (the caller carries on)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            if failure is None:
                return
            raise ServerError(failure())
        time.sleep(poll)


@dataclass
class Server:
    url: str
    port: int
    directory: Path
    process: subprocess.Popen[bytes]
    extra: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)  # to start it again
    log: Path | None = None
    # The processes the last kill() left for the system to reap.
    killed: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def _signal(self, signum: int) -> None:
        # The server leads its own process group; signalling the group reaches
        # it through `runuser` too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)

    def kill(self) -> None:
        """kill -9 of the server and every process under it, as a crash of
        its machine would. PostgreSQL's children lead process groups of
        their own, out of the group signal's reach: left alive, a backend
        would finish the commit it was in after its postmaster died."""
        self._signal(signal.SIGSTOP)  # no new child while they are found
        below = descendants(self.process.pid)
        for pid in below:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._signal(signal.SIGKILL)
        self.process.wait()
        _until(lambda: all(_dead(pid) for pid in below), 10, None, poll=0.005)
        self.killed = below

    def stop_immediately(self) -> None:
        """PostgreSQL's `pg_ctl -m immediate stop` (SIGQUIT): no checkpoint,
        crash recovery on the next start. A server that does not end within
        STOP_SECONDS (a stopped process acts on no signal but SIGCONT and
        SIGKILL) is killed, as `kill` does, rather than waited on forever."""
        self._signal(signal.SIGQUIT)
        self._signal(signal.SIGCONT)
        try:
            self.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.kill()

    def start_again(self) -> None:
        """Starts the stopped (or killed) server on the same port and data."""
        assert self.command and self.log is not None
        # Until it is reaped, a killed postmaster's pid answers PostgreSQL's
        # check of its lock file, and the new server would refuse to start.
        reaped = lambda: not any(Path(f"/proc/{pid}").exists() for pid in self.killed)  # noqa: E731
        _until(reaped, 10, None, poll=0.005)
        log_file = open(self.log, "ab")  # noqa: SIM115 - handed to the child for its lifetime
        self.process = subprocess.Popen(
            self.command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        _wait_for_port(self.port, self.process, "server", self.log)
        if self.url.startswith("postgresql://"):
            _wait_for_postgres(self.url)

    def stop(self) -> None:
        if self.process.poll() is None:
            self._signal(signal.SIGINT)  # fast shutdown for postgres, clean for redis
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def _wait_for_port(port: int, process: subprocess.Popen[bytes], what: str, log: Path) -> None:
    def listening() -> bool:
        if process.poll() is not None:
            raise ServerError(f"{what} exited with {process.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return True
        return False

    _until(listening, 60, lambda: f"{what} did not listen on port {port} within 60 s")


POSTGRES_SETTINGS = {
    # Queue-friendly server settings: autovacuum wakes every second so the
    # per-table thresholds of the queue tables are acted on quickly.
    "autovacuum_naptime": "1s",
    "max_connections": "200",
    "shared_buffers": "256MB",
    "listen_addresses": "127.0.0.1",
    "unix_socket_directories": "",
}


def _wait_for_postgres(url: str) -> None:
    """Listening is not yet accepting (recovery, start-up): waits until a query works."""
    psql = [str(postgres_bindir() / "psql"), url, "-Atc", "select 1"]
    tried: list[subprocess.CompletedProcess[bytes]] = []

    def answers() -> bool:
        tried.append(subprocess.run(psql, capture_output=True, check=False))
        return tried[-1].returncode == 0

    _until(answers, 60, lambda: f"postgres not ready: {tried[-1].stderr.decode()}", poll=0.1)


def _postgres_directory(name: str) -> tuple[list[str], Path]:
    """The command prefix that runs as the user PostgreSQL runs as, and a
    fresh directory of that user's for the server's data."""
    prefix, uid, gid = _as_postgres_user()
    directory = Path(tempfile.mkdtemp(prefix=name))
    if uid is not None and gid is not None:
        os.chown(directory, uid, gid)
    return prefix, directory


def start_postgres(port: int | None = None, settings: dict[str, str] | None = None) -> Server:
    prefix, directory = _postgres_directory("rota-pg-")
    data = directory / "data"
    initdb = [str(postgres_bindir() / "initdb"), "-D", str(data), "-U", "rota", "--auth=trust"]
    initdb += ["--encoding=UTF8", "--locale=C.UTF-8"]
    subprocess.run([*prefix, *initdb], check=True, capture_output=True)
    return _run_postgres(prefix, data, port or free_port(), "postgres", settings or {})


def _run_postgres(
    prefix: list[str], data: Path, port: int, what: str, settings: dict[str, str]
) -> Server:
    """PostgreSQL started on `data`, accepting queries, its log beside `data`."""
    log = data.parent / "postgres.log"
    options: list[str] = []
    for key, value in {**POSTGRES_SETTINGS, **settings}.items():
        options += ["-c", f"{key}={value}"]
    log_file = open(log, "wb")  # noqa: SIM115 - handed to the child for its lifetime
    command = [*prefix, str(postgres_bindir() / "postgres"), "-D", str(data), "-p", str(port)]
    process = subprocess.Popen(
        [*command, *options], stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
    )
    _wait_for_port(port, process, what, log)
    url = f"postgresql://rota@127.0.0.1:{port}/postgres"
    _wait_for_postgres(url)
    return Server(url, port, data.parent, process, command=[*command, *options], log=log)


def start_postgres_standby(
    primary: Server, name: str = "standby1", synchronous: bool = True
) -> Server:
    """A streaming standby of `primary` (pg_basebackup, hot standby) on a free
    port; with `synchronous`, the primary's commits wait for it to flush
    (synchronous_standby_names). `SELECT pg_promote()` on it fails over."""
    prefix, directory = _postgres_directory("rota-pg-standby-")
    data = directory / "data"
    source = f"host=127.0.0.1 port={primary.port} user=rota application_name={name}"
    subprocess.run(
        [
            *(*prefix, str(postgres_bindir() / "pg_basebackup"), "-d", source, "-D", str(data)),
            *("-X", "stream", "-R", "--checkpoint=fast"),
        ],
        check=True,
        capture_output=True,
    )
    server = _run_postgres(prefix, data, free_port(), "postgres standby", {})
    import psycopg
    from psycopg import sql

    with psycopg.connect(primary.url, autocommit=True) as conn:
        if synchronous:
            conn.execute(
                sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(sql.Literal(name))
            )
            conn.execute("SELECT pg_reload_conf()")
        wanted = "sync" if synchronous else "async"
        streaming = (
            "SELECT 1 FROM pg_stat_replication WHERE application_name = %s"
            " AND state = 'streaming' AND sync_state = %s"
        )
        _until(
            lambda: conn.execute(streaming, [name, wanted]).fetchone() is not None,
            30,
            lambda: f"the standby was not streaming ({wanted}) within 30 s",
        )
    return server


def start_redis(
    port: int | None = None,
    appendonly: bool = True,
    tls: TLSFiles | None = None,
    cluster: bool = False,
    also_on: Sequence[str] = (),
    appendfsync: str = "everysec",
) -> Server:
    """A Redis on `port`; with `tls`, that port speaks TLS only (rediss://);
    with `cluster`, a cluster node not yet part of any cluster; `also_on`:
    addresses it listens on besides loopback (rota_tools.netns);
    `appendfsync`: "always" for tests that kill it and count what it
    acknowledged (docs/howto/setup.md)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ServerError("redis-server not found: run `bash infra/install-servers.sh`")
    port = port or free_port()
    directory = Path(tempfile.mkdtemp(prefix="rota-redis-"))
    log = directory / "redis.log"
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", *also_on]
    # The test network's hosts are "outside" to Redis: let them in.
    args += ["--protected-mode", "no"] if also_on else []
    args += ["--dir", str(directory), "--save", "", "--daemonize", "no", "--logfile", str(log)]
    # The buffer's durability is Redis's. With "everysec" (Redis's default) a
    # write that waits behind a slow fsync is acknowledged from memory, and a
    # kill -9 then loses it; with "always" the write and its fsync precede the reply.
    args += ["--appendonly", "yes" if appendonly else "no", "--appendfsync", appendfsync]
    if cluster:
        # The bus port is named: the default (port + 10000) may be taken or
        # past 65535. A short node timeout makes failovers quick in tests.
        args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        args += ["--cluster-port", str(free_port()), "--cluster-node-timeout", "1000"]
    if tls is not None:
        args += ["--port", "0", "--tls-port", str(port), "--tls-auth-clients", "no"]
        args += ["--tls-cert-file", str(tls.cert), "--tls-key-file", str(tls.key)]
        args += ["--tls-ca-cert-file", str(tls.ca)]
    process = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    _wait_for_port(port, process, "redis", log)
    return Server(
        url=f"redis://127.0.0.1:{port}/0",
        port=port,
        directory=directory,
        process=process,
        command=args,
        log=directory / "redis.out",
    )


def start_pgbouncer(
    postgres: Server | str, pool_mode: str = "session", max_client_conn: int | None = None
) -> Server:
    """A PgBouncer in front of `postgres` (a server, or the URL of one on
    this machine; any database: the URL names none), its settings at their
    defaults but the pool mode and, if given, how many clients it takes (100
    by default)."""
    from psycopg.conninfo import conninfo_to_dict

    target = conninfo_to_dict(postgres.url if isinstance(postgres, Server) else postgres)
    host, target_port = target.get("host", "127.0.0.1"), target.get("port", "5432")
    binary = shutil.which("pgbouncer", path=f"{os.environ.get('PATH', '')}:/usr/sbin")
    if binary is None:
        raise ServerError("pgbouncer not found: run `bash infra/install-servers.sh`")
    prefix, uid, gid = _as_postgres_user()  # it refuses to run as root
    port = free_port()
    directory = Path(tempfile.mkdtemp(prefix="rota-pgbouncer-"))
    log = directory / "pgbouncer.log"
    (directory / "users.txt").write_text('"rota" ""\n')
    config = directory / "pgbouncer.ini"
    config.write_text(
        f"[databases]\n* = host={host} port={target_port}\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {directory / 'users.txt'}\npool_mode = {pool_mode}\n"
        f"logfile = {log}\n" + (f"max_client_conn = {max_client_conn}\n" if max_client_conn else "")
    )
    if uid is not None and gid is not None:
        for path in (directory, *directory.iterdir()):
            os.chown(path, uid, gid)
    process = subprocess.Popen(
        [*prefix, binary, str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    _wait_for_port(port, process, "pgbouncer", log)
    return Server(
        url=f"postgresql://rota@127.0.0.1:{port}", port=port, directory=directory, process=process
    )


@dataclass(frozen=True)
class TLSFiles:
    """A server certificate (for localhost and 127.0.0.1) and the CA that signed it."""

    ca: Path
    cert: Path
    key: Path


def make_tls_files() -> TLSFiles:
    """A fresh certificate authority and a server certificate it signs
    (openssl), in a temporary directory of their own."""
    directory = Path(tempfile.mkdtemp(prefix="rota-tls-"))
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key, csr = directory / "server.pem", directory / "server.key", directory / "server.csr"
    extensions = directory / "san.cnf"
    extensions.write_text("subjectAltName = DNS:localhost, IP:127.0.0.1\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    new_key = ["-newkey", "rsa:2048", "-nodes"]
    openssl("req", "-x509", *new_key, "-days", "2", "-subj", "/CN=rota test CA",
            "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    openssl("req", *new_key, "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(csr))
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "2", "-extfile", str(extensions),
            "-out", str(cert))  # fmt: skip
    key.chmod(0o600)
    _, uid, gid = _as_postgres_user()
    if uid is not None and gid is not None:  # PostgreSQL reads its key as `postgres`
        for path in (directory, cert, key, ca):
            os.chown(path, uid, gid)
    return TLSFiles(ca=ca, cert=cert, key=key)


def postgres_tls_settings(tls: TLSFiles) -> dict[str, str]:
    return {"ssl": "on", "ssl_cert_file": str(tls.cert), "ssl_key_file": str(tls.key)}


def _remove(server: Server) -> None:
    server.stop()
    shutil.rmtree(server.directory, ignore_errors=True)


Started = TypeVar("Started", "Server", "RedisCluster", "SparkCluster")


@contextlib.contextmanager
def _removed(started: Started) -> Iterator[Started]:
    """The started server (or cluster) until the block ends, then stopped
    and its files removed."""
    try:
        yield started
    finally:
        if isinstance(started, Server):
            _remove(started)
        else:
            started.stop()


def local_postgres(settings: dict[str, str] | None = None) -> AbstractContextManager[Server]:
    return _removed(start_postgres(settings=settings))


def local_redis(
    appendonly: bool = True,
    tls: TLSFiles | None = None,
    also_on: Sequence[str] = (),
    appendfsync: str = "everysec",
) -> AbstractContextManager[Server]:
    return _removed(
        start_redis(appendonly=appendonly, tls=tls, also_on=also_on, appendfsync=appendfsync)
    )


@dataclass
class RedisCluster:
    """A Redis Cluster on loopback: `masters` nodes owning the slots, each
    with `replicas` replicas; `url` names the first master."""

    nodes: list[Server]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def stop(self) -> None:
        for node in self.nodes:
            _remove(node)


def start_redis_cluster(masters: int = 3, replicas: int = 0) -> RedisCluster:
    cli = shutil.which("redis-cli")
    if cli is None:
        raise ServerError("redis-cli not found: run `bash infra/install-servers.sh`")
    nodes: list[Server] = []
    try:
        for _ in range(masters * (1 + replicas)):
            nodes.append(start_redis(cluster=True))
        create = [cli, "--cluster", "create", "--cluster-yes", "--cluster-replicas", str(replicas)]
        created = subprocess.run(
            [*create, *(f"127.0.0.1:{node.port}" for node in nodes)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if created.returncode != 0:
            raise ServerError(f"redis-cli --cluster create failed: {created.stdout[-2000:]}")
        cluster = RedisCluster(nodes)
        wait_for_cluster(cluster)
        return cluster
    except BaseException:
        for node in nodes:
            _remove(node)
        raise


def wait_for_cluster(cluster: RedisCluster, timeout: float = 60) -> None:
    """Until every live node says the cluster is whole (`cluster_state:ok`)
    and knows every other node, and every replica has synced with its master
    (a replica that never synced cannot take over)."""
    cli = shutil.which("redis-cli") or "redis-cli"
    live = [node for node in cluster.nodes if node.process.poll() is None]

    def ask(node: Server, *command: str) -> str:
        return subprocess.run(
            [cli, "-p", str(node.port), *command], capture_output=True, text=True
        ).stdout

    def every_node_whole() -> bool:
        states = []
        for node in live:
            info = ask(node, "cluster", "info")
            known = int(_field(info, "cluster_known_nodes") or 0)
            replication = ask(node, "info", "replication")
            synced = _field(replication, "role") != "slave" or (
                _field(replication, "master_link_status") == "up"
            )
            whole = _field(info, "cluster_state") == "ok" and known == len(cluster.nodes)
            states.append(whole and synced)
        return all(states)

    _until(
        every_node_whole,
        timeout,
        lambda: f"the Redis Cluster was not whole within {timeout:.0f} s",
        0.1,
    )


def _field(info: str, name: str) -> str | None:
    for line in info.splitlines():
        key, _, value = line.strip().partition(":")
        if key == name:
            return value
    return None


def local_redis_cluster(
    masters: int = 3, replicas: int = 0
) -> AbstractContextManager[RedisCluster]:
    return _removed(start_redis_cluster(masters, replicas))


@dataclass
class SparkCluster:
    """A standalone Spark cluster on loopback, from the installed PySpark:
    a master and `workers` workers of `cores` cores each."""

    master: Server
    workers: list[Server]
    web_port: int

    @property
    def url(self) -> str:
        return self.master.url

    def alive_workers(self) -> int:
        import json
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/json/", timeout=5) as page:
            return int(json.load(page).get("aliveworkers", 0))

    def executor_logs(self) -> list[Path]:
        """Each executor's stderr, under its worker's work directory."""
        return sorted(p for w in self.workers for p in w.directory.glob("work/app-*/*/stderr"))

    def stop(self) -> None:
        for server in [*self.workers, self.master]:
            _remove(server)


def _spark_class() -> str:
    import pyspark

    script = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if not script.exists():
        raise ServerError(f"{script} not found: install rota[spark]")
    return str(script)


def _start_spark_process(args: list[str], port: int, what: str, directory: Path) -> Server:
    log = directory / f"{what}.log"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(directory)}
    env.pop("SPARK_CONF_DIR", None)
    with log.open("ab") as out:
        process = subprocess.Popen(
            [_spark_class(), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=directory,
            env=env,
        )
    _wait_for_port(port, process, f"spark {what}", log)
    return Server(f"spark://127.0.0.1:{port}", port, directory, process, log=log)


def start_spark_cluster(workers: int = 2, cores: int = 1, memory: str = "1g") -> SparkCluster:
    port, web_port = free_port(), free_port()
    master = _start_spark_process(
        [
            *("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"),
            *("--port", str(port), "--webui-port", str(web_port)),
        ],
        port,
        "master",
        Path(tempfile.mkdtemp(prefix="rota-spark-master-")),
    )
    cluster = SparkCluster(master, [], web_port)
    try:
        for number in range(workers):
            worker_port = free_port()
            directory = Path(tempfile.mkdtemp(prefix=f"rota-spark-worker-{number}-"))
            worker = _start_spark_process(
                [
                    *("org.apache.spark.deploy.worker.Worker", master.url, "--host", "127.0.0.1"),
                    *("--port", str(worker_port), "--webui-port", str(free_port())),
                    *("--cores", str(cores), "--memory", memory),
                    *("--work-dir", str(directory / "work")),
                ],
                worker_port,
                f"worker-{number}",
                directory,
            )
            cluster.workers.append(worker)
        registered = lambda: cluster.alive_workers() >= workers  # noqa: E731
        _until(
            registered, 60, lambda: f"Spark workers did not register in 60 s: {log_of(master)}", 0.2
        )
        return cluster
    except BaseException:
        cluster.stop()
        raise


def log_of(server: Server) -> str:
    return server.log.read_text()[-2000:] if server.log and server.log.exists() else ""


def local_spark_cluster(workers: int = 2, cores: int = 1) -> AbstractContextManager[SparkCluster]:
    return _removed(start_spark_cluster(workers, cores))


def local_pgbouncer(
    postgres: Server, pool_mode: str = "session", max_client_conn: int | None = None
) -> AbstractContextManager[Server]:
    return _removed(start_pgbouncer(postgres, pool_mode, max_client_conn))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    # SIGTERM (a process manager, `kill`) stops the servers as Ctrl-C does.
    signal.signal(signal.SIGTERM, _interrupt)
    with local_postgres() as pg, local_redis() as rd:
        print(f"export ROTA_DATABASE_URL={pg.url}")
        print(f"export ROTA_REDIS_URL={rd.url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
