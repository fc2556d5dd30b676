"""Real processes killed with SIGKILL, or stopped with SIGTERM: nothing lost, nothing duplicated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from rota import App, EnqueueError, Settings, core
from rota.core import db
from rota.loader import Loader
from rota.producer.breaker import BreakerState
from rota_tools.devservers import local_redis
from tests.helpers import pending_idle_past_reclaim, start_logged, wait_for

CHILD = Path(__file__).with_name("loader_child.py")
SPARK_LOADER = [
    pytest.mark.spark,
    pytest.mark.slow(reason="a Spark loader in a subprocess: its JVM and first micro-batch"),
]


def _env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "ROTA_DATABASE_URL": settings.database_url,
        "ROTA_REDIS_URL": settings.redis_url,
        "ROTA_SHARDS": str(settings.shards),
    }


@pytest.mark.parametrize("stage", ["before-commit", "before-ack"])
def test_a_loader_killed_mid_batch_loses_and_duplicates_nothing(
    app: App, settings: Settings, database_url: str, stage: str
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    ids = app.enqueue_many(
        [parse_pdf.using(tenant=f"t{i % 7}").prepare(str(i)) for i in range(1000)]
    )
    ids += [parse_pdf.using(tenant="solo").enqueue("single") for _ in range(20)]
    child = subprocess.Popen(
        [sys.executable, str(CHILD), stage], env=_env(settings), stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.kill()  # SIGKILL, at the chosen point
    child.wait()
    with psycopg.connect(database_url, autocommit=True) as conn:
        loaded_before = conn.execute("SELECT count(*) FROM rota.tasks").fetchone()
        assert loaded_before == ((0,) if stage == "before-commit" else (1020,))
        wait_for(lambda: pending_idle_past_reclaim(settings), what="the entries to be idle")
        loader = Loader(settings)
        summary = loader.drain()
        loader.close()
        assert summary.drained and summary.reclaimed > 0
        assert summary.loaded == (1020 if stage == "before-commit" else 0)
        assert db.run(conn, core.queue_counts())["pdfs"]["ready"] == 1020
        states = db.run(conn, core.task_states(ids))
        assert set(states) == set(ids)
    assert sum(s["entries"] for s in Loader(settings).buffer_stats().values()) == 0


def test_redis_killed_mid_burst_every_acknowledged_task_is_stored_once(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    # "always": with "everysec" a write waiting behind a slow fsync is
    # acknowledged from Redis's memory, which the kill -9 takes.
    with local_redis(appendfsync="always") as server:
        settings = Settings(
            database_url=database_url,
            redis_url=server.url,
            shards=4,
            redis_timeout=0.2,
            redis_retries=1,
            breaker_failures=3,
            breaker_reset_seconds=0.3,
        )
        app = App(settings)
        acknowledged: list[UUID] = []
        failures: list[Exception] = []
        stop = threading.Event()

        def burst() -> None:
            i = 0
            while not stop.is_set():
                try:
                    acknowledged.append(app.enqueue("x.y", args=[i], queue="q", tenant=f"t{i % 5}"))
                except EnqueueError as exc:
                    failures.append(exc)
                i += 1

        producer = threading.Thread(target=burst)
        producer.start()
        core = app.producer.core
        wait_for(lambda: len(acknowledged) > 50, what="the burst")
        server.kill()  # kill -9 in the middle of the burst
        killed_at = len(acknowledged)
        # The burst goes on, into PostgreSQL...
        wait_for(lambda: core.fallbacks > 20, what="enqueues to fall back")
        server.start_again()  # from its append-only file: every acknowledged write
        # ...and back into Redis, once the breaker's probe succeeds.
        wait_for(lambda: core.breaker.state is BreakerState.CLOSED, what="the breaker to close")
        back_at = len(acknowledged)
        wait_for(lambda: len(acknowledged) > back_at + 20, what="enqueues into Redis again")
        stop.set()
        producer.join()
        app.close()
        assert killed_at > 50 and len(acknowledged) > killed_at + 20
        assert core.fallbacks > 0
        assert failures == []  # PostgreSQL was up: nothing refused
        loader = Loader(settings)
        assert loader.drain().drained
        loader.close()
    stored = conn.execute(
        "SELECT count(*), count(DISTINCT id) FROM rota.tasks WHERE id = ANY(%s)", [acknowledged]
    ).fetchone()
    assert stored == (len(acknowledged), len(acknowledged))


@pytest.mark.parametrize(
    ("engine", "signum"),
    [
        ("python", signal.SIGTERM),
        pytest.param("spark", signal.SIGTERM, marks=SPARK_LOADER),
        # A SparkContext puts its own handler on SIGINT (Ctrl-C), which
        # cancelled the batch in hand until rota's replaced it.
        pytest.param("spark", signal.SIGINT, marks=SPARK_LOADER),
    ],
    ids=["python-SIGTERM", "spark-SIGTERM", "spark-SIGINT"],
)
def test_a_running_loader_stops_on_a_signal_after_the_batch_in_hand(
    app: App,
    settings: Settings,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
    engine: str,
    signum: int,
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    spark = ["--master", "local[2]", "--checkpoint", str(tmp_path / "checkpoint")]
    ids: list[UUID] = []
    with start_logged(
        [
            sys.executable,
            "-m",
            "rota",
            "loader",
            "run",
            "--engine",
            engine,
            *(spark if engine == "spark" else []),
        ],
        env=_env(settings),
    ) as loader:  # killed on the way out if it still runs
        deadline = time.monotonic() + 120  # Spark's session and first batch take a while
        # Enqueue in bursts until the loader has loaded some and is still at it.
        while db.run(conn, core.queue_counts()).get("pdfs", {}).get("ready", 0) == 0:
            assert time.monotonic() < deadline, "the loader loaded nothing"
            ids += app.enqueue_many(
                [parse_pdf.using(tenant=f"t{i % 7}").prepare(str(len(ids) + i)) for i in range(500)]
            )
            time.sleep(0.1)
        ids += app.enqueue_many(
            [parse_pdf.using(tenant="late").prepare(str(i)) for i in range(2000)]
        )
        loader.stop(signum, timeout=60)
    stdout, stderr = loader.output(), loader.errors()
    assert loader.returncode == 0, stderr[-3000:]

    def stored() -> tuple[int, int]:
        row = conn.execute(
            "SELECT count(*), count(DISTINCT id) FROM rota.tasks WHERE id = ANY(%s)", [ids]
        ).fetchone()
        assert row is not None
        return row[0], row[1]

    loaded, _ = stored()
    assert loaded > 0
    if engine == "python":
        assert json.loads(stdout.strip().splitlines()[-1])["loaded"] == loaded
    # It finished what it had read: nothing is left pending for a reclaim (the
    # Spark source keeps its place in its checkpoint, not in a consumer group).
    leftover = Loader(settings)
    assert sum(int(s["pending"]) for s in leftover.buffer_stats().values()) == 0
    rest = leftover.drain()
    leftover.close()
    assert rest.drained and rest.reclaimed == 0
    assert loaded + rest.loaded == len(ids)
    assert stored() == (len(ids), len(ids))
