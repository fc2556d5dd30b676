"""Small helpers shared by the test tiers."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from types import TracebackType
from typing import IO, Any

import psycopg

from rota import core
from rota.core import db
from rota.model.envelope import TaskEnvelope, make_envelope


def envelopes(
    tenant: str,
    count: int,
    *,
    queue: str = "default",
    name: str = "tests.noop",
    cost: float = 1.0,
    eta: datetime | None = None,
    max_attempts: int = 3,
    backoff_base: float = 1.0,
    priority: int = 0,
    limit_key: str | None = None,
) -> list[TaskEnvelope]:
    return [
        make_envelope(
            name=name,
            queue=queue,
            tenant=tenant,
            args=[i],
            cost=cost,
            eta=eta,
            max_attempts=max_attempts,
            backoff_base=backoff_base,
            priority=priority,
            limit_key=limit_key,
        )
        for i in range(count)
    ]


def load(conn: psycopg.Connection[Any], batch: Iterable[TaskEnvelope]) -> int:
    return db.transact(conn, core.load(list(batch)))


def claim(
    conn: psycopg.Connection[Any],
    limit: int = 100,
    queues: tuple[str, ...] = ("default",),
    worker: str = "test-worker",
    lease_seconds: float = 60.0,
) -> list[core.ClaimedTask]:
    return db.transact(conn, core.claim(list(queues), limit, worker, lease_seconds))


def drain_order(conn: psycopg.Connection[Any], batch: int = 1) -> list[str]:
    """Claims and completes everything, one batch at a time; returns tenants in claim order."""
    order: list[str] = []
    while True:
        got = claim(conn, batch)
        if not got:
            return order
        order.extend(t.tenant for t in got)
        db.transact(conn, core.complete(t.token for t in got))


def spark_env(settings: Any) -> dict[str, str]:
    """The environment of a `rota` command run by a Spark test: the servers
    of `settings`, and no SPARK_CONF_DIR (a machine's spark-defaults.conf
    stays out of the tests' sessions)."""
    env = {
        **os.environ,
        "ROTA_DATABASE_URL": settings.database_url,
        "ROTA_REDIS_URL": settings.redis_url,
        "ROTA_SHARDS": str(settings.shards),
    }
    env.pop("SPARK_CONF_DIR", None)
    return env


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "the condition") -> Any:
    """Polls `check` until it returns something truthy (returned), or fails
    the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def waiting_on_a_lock(conn: psycopg.Connection[Any], pid: int) -> bool:
    """Whether the backend `pid` waits for a lock (seen in pg_locks)."""
    row = conn.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [pid])
    return bool(row.fetchone()[0])  # type: ignore[index]


def pending_idle_past_reclaim(settings: Any) -> bool:
    """Whether the buffer has entries read but not acknowledged, all idle long
    enough for a loader to reclaim them (ROTA_LOADER_IDLE_RECLAIM_SECONDS)."""
    import redis

    from rota.buffer.streams import all_streams

    idle_ms = int(settings.loader_idle_reclaim_seconds * 1000) + 1
    client = redis.Redis.from_url(settings.redis_url)
    try:
        pending = idle = 0
        for stream in all_streams(settings.stream_prefix, settings.shards):
            if not client.exists(stream):
                continue
            group = settings.loader_group
            pending += len(client.xpending_range(stream, group, "-", "+", 10_000))
            idle += len(client.xpending_range(stream, group, "-", "+", 10_000, idle=idle_ms))
        return pending > 0 and idle == pending
    finally:
        client.close()


class LoggedProcess:
    """A child process whose stdout and stderr go to temporary files, never to
    pipes: a pipe nobody reads until the child exits fills (64 KiB: a loader's
    line per batch does within a slow run) and blocks the child in its next
    write for good, where even SIGTERM is never acted on.

    `output()` and `errors()` are what it wrote so far (during the run, or all
    of it after). `stop()` signals it and waits, and kills it if it does not
    exit in time; as a context manager it is killed and reaped on exit if still
    running. Once reaped, its text is kept and the files closed. `pid`,
    `args`, `returncode`, `poll`, `wait`, `send_signal`, `terminate` and `kill`
    are the Popen's."""

    def __init__(self, args: Sequence[str | os.PathLike[str]], **popen: Any) -> None:
        self._files: tuple[IO[bytes], IO[bytes]] = (
            tempfile.TemporaryFile(),  # noqa: SIM115 - closed once the process is reaped
            tempfile.TemporaryFile(),  # noqa: SIM115
        )
        self._text: tuple[str, str] | None = None  # (stdout, stderr), once reaped
        try:
            self.process = subprocess.Popen(
                args, stdout=self._files[0], stderr=self._files[1], **popen
            )
        except BaseException:
            for file in self._files:
                file.close()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def args(self) -> Any:
        return self.process.args

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def output(self) -> str:
        """What it wrote to stdout so far."""
        return self._read(0)

    def errors(self) -> str:
        """What it wrote to stderr so far."""
        return self._read(1)

    def poll(self) -> int | None:
        returncode = self.process.poll()
        if returncode is not None:
            self._keep_text()
        return returncode

    def wait(self, timeout: float | None = None) -> int:
        returncode = self.process.wait(timeout)
        self._keep_text()
        return returncode

    def send_signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def terminate(self) -> None:
        self.process.terminate()

    def kill(self) -> None:
        self.process.kill()

    def stop(self, signum: int | None = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Sends `signum` if it still runs (None: sends nothing, one was sent
        already) and returns its exit code once it exits. Still running after
        `timeout` seconds: it is killed and reaped, and TimeoutExpired raised."""
        try:
            if signum is not None and self.process.poll() is None:
                self.process.send_signal(signum)
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            print(f"still running {timeout} s after the stop signal, killed: {self.args}")
            print(f"its stderr ends:\n{self.errors()[-3000:]}")
            raise
        finally:
            self.close()

    def close(self) -> None:
        """Kills it if it still runs, reaps it, and keeps its text."""
        if self.process.poll() is None:
            self.process.kill()
        self.wait()

    def __enter__(self) -> LoggedProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _read(self, which: int) -> str:
        if self._text is not None:
            return self._text[which]
        # pread: the child shares the file's offset, which a seek would move.
        fd = self._files[which].fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def _keep_text(self) -> None:
        if self._text is None:
            self._text = (self._read(0), self._read(1))
            for file in self._files:
                file.close()


def start_logged(args: Sequence[str | os.PathLike[str]], **popen: Any) -> LoggedProcess:
    """Starts `args` (Popen's other arguments but stdout and stderr allowed)
    with its stdout and stderr in temporary files: see LoggedProcess."""
    return LoggedProcess(args, **popen)


def shallow_clone() -> bool:
    """Whether this checkout lacks git history (or git): tests that run an
    earlier version of rota from history are skipped then."""
    done = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"], capture_output=True, text=True
    )
    return done.returncode != 0 or done.stdout.strip() == "true"
