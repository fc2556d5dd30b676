"""The Spark streaming loader (`rota loader run --engine spark`, a child process)
through failures in the middle of a micro-batch: an executor's Python worker
killed with SIGKILL, the driver killed with SIGKILL and started again from its
checkpoint, PostgreSQL stopped with `-m immediate` and started again. Each
group of a shard's tenants loads in its own transaction with its ledger row:
after each fault every task is stored exactly once, and the buffer is
trimmed."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
import redis

from rota import App, Settings, core
from rota.buffer.streams import all_streams, dead_letter_stream
from rota.core import db
from rota_tools.devservers import Server, descendants
from tests.helpers import LoggedProcess, spark_env, start_logged, wait_for

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow(reason="a Spark loader in a subprocess: its JVM and first micro-batch"),
]
Conn = psycopg.Connection[Any]
# Enough that a micro-batch's shards (four, two at a time in local[2]) take
# a while to load: the faults land between the first shard's commit and the last's.
TASKS = 60_000


def _start_loader(settings: Settings, checkpoint: Path) -> LoggedProcess:
    return start_logged(
        [
            *(sys.executable, "-m", "rota", "loader", "run", "--engine", "spark"),
            *("--master", "local[2]", "--checkpoint", str(checkpoint)),
            *("--trigger-seconds", "0.2"),
        ],
        env=spark_env(settings),
    )


def _enqueue(app: App, tasks: int) -> list[UUID]:
    parse_pdf = app.tasks["parse_pdf"]
    ids: list[UUID] = []
    for start in range(0, tasks, 10_000):
        ids += app.enqueue_many(
            [
                parse_pdf.using(tenant=f"t{i % 97}").prepare(str(i))
                for i in range(start, start + 10_000)
            ]
        )
    return ids


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(text[text.rindex(")") + 2 :].split()[1])


def _sockets_to(port: int) -> set[str]:
    """The inodes of the loopback TCP connections to `port` (from /proc/net)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    found.add(fields[9])  # ESTABLISHED
    return found


def loading_python_workers(roots: Iterable[int], database_port: int) -> list[int]:
    """The executors' Python workers (forked by a `pyspark.daemon`) below
    `roots` that hold a connection to PostgreSQL: loading a shard."""
    sockets = _sockets_to(database_port)
    workers = []
    for pid in descendants(*roots):
        if "pyspark.daemon" not in _command(pid) or "pyspark.daemon" not in _command(_parent(pid)):
            continue
        with contextlib.suppress(OSError):
            links = {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
            if any(f"socket:[{inode}]" in links for inode in sockets):
                workers.append(pid)
    return workers


def parts_loaded(conn: Conn) -> int:
    """The ledger rows of the query's first micro-batch (one per group of a
    shard's tenants loaded)."""
    row = conn.execute("SELECT count(*) FROM rota.loader_batches WHERE batch_id = 0").fetchone()
    return int(row[0]) if row else 0


def parts(settings: Settings) -> int:
    """A micro-batch's ledger rows when every shard has entries."""
    return settings.shards * settings.spark_shard_connections


def _mid_batch(conn: Conn, settings: Settings) -> bool:
    return 0 < parts_loaded(conn) < parts(settings)


def _stored(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM rota.tasks").fetchone()
    return int(row[0]) if row else 0


def _buffered(settings: Settings) -> int:
    with redis.Redis.from_url(settings.redis_url) as client:
        return sum(client.xlen(s) for s in all_streams(settings.stream_prefix, settings.shards))


def _now(conn: Conn) -> Any:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]


def _finish_and_check(
    loader: LoggedProcess, settings: Settings, database_url: str, ids: list[UUID], fault_at: Any
) -> None:
    """Waits until every task is loaded and the buffer trimmed, stops the
    loader, and checks that each task is stored once and each shard of the
    interrupted batch was loaded once, some before the fault and some after."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        wait_for(lambda: _stored(conn) >= len(ids), timeout=180, what="every task loaded")
        wait_for(lambda: _buffered(settings) == 0, timeout=60, what="the buffer trimmed")
        loader.stop(signal.SIGTERM, timeout=60)
        assert loader.returncode == 0, loader.errors()[-3000:]
        stored = conn.execute("SELECT count(*), count(DISTINCT id) FROM rota.tasks").fetchone()
        assert stored == (len(ids), len(ids))
        assert set(db.run(conn, core.task_states(ids))) == set(ids)
        # The interrupted batch held the whole backlog: one ledger row per
        # group of each shard, and the tasks they stored add up to the backlog.
        ledger = conn.execute(
            "SELECT count(*), sum(tasks), min(loaded_at), max(loaded_at)"
            " FROM rota.loader_batches WHERE batch_id = 0"
        ).fetchone()
        assert ledger is not None and ledger[:2] == (parts(settings), len(ids))
        assert ledger[2] < fault_at < ledger[3]
    with redis.Redis.from_url(settings.redis_url) as client:
        assert client.xlen(dead_letter_stream(settings.stream_prefix)) == 0


def test_an_executor_python_worker_killed_mid_batch(
    app: App, settings: Settings, database_url: str, conn: Conn, tmp_path: Path
) -> None:
    ids = _enqueue(app, TASKS)
    port = int(conn.info.port)
    with _start_loader(settings, tmp_path / "checkpoint") as loader:
        victims = wait_for(
            lambda: _mid_batch(conn, settings) and loading_python_workers([loader.pid], port),
            timeout=180,
            what="a Python worker loading a shard after another shard committed",
        )
        fault_at = _now(conn)
        os.kill(victims[0], signal.SIGKILL)  # its shard's transaction rolls back
        # The batch fails; the query restarts from its checkpoint and the
        # replayed batch loads only the shards without a ledger row.
        _finish_and_check(loader, settings, database_url, ids, fault_at)


def test_the_driver_killed_mid_batch_then_started_again_from_its_checkpoint(
    app: App, settings: Settings, database_url: str, conn: Conn, tmp_path: Path
) -> None:
    ids = _enqueue(app, TASKS)
    checkpoint = tmp_path / "checkpoint"
    with _start_loader(settings, checkpoint) as doomed:
        wait_for(lambda: _mid_batch(conn, settings), timeout=180, what="a shard of the batch")
        below = descendants(doomed.pid)
        fault_at = _now(conn)
        doomed.kill()  # the driver's Python process: its JVM and workers go with it
        doomed.wait()
    # The JVM notices its driver's end and exits, with its Python workers.
    wait_for(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in below),
        timeout=60,
        what="the killed driver's JVM and workers to exit",
    )
    with _start_loader(settings, checkpoint) as loader:
        _finish_and_check(loader, settings, database_url, ids, fault_at)


def test_postgresql_restarted_mid_batch(
    app: App,
    settings: Settings,
    database_url: str,
    conn: Conn,
    postgres_server: Server,
    tmp_path: Path,
) -> None:
    ids = _enqueue(app, TASKS)
    with _start_loader(settings, tmp_path / "checkpoint") as loader:
        wait_for(lambda: _mid_batch(conn, settings), timeout=180, what="a shard of the batch")
        fault_at = _now(conn)
        postgres_server.stop_immediately()
        postgres_server.start_again()
        # The shards in flight rolled back; the batch is tried again in place.
        _finish_and_check(loader, settings, database_url, ids, fault_at)
