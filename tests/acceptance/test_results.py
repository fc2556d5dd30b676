"""Results with a real worker process: awaited from this process (another
than the worker's) through NOTIFY, refused when too big with the task still
succeeded, a dead task's error raised, and expiry told apart from a task
that keeps none."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

import rota
from rota import App, Settings, core
from rota.core import db
from rota.core.results import prune_results
from rota.model.envelope import new_task_id
from tests.acceptance.test_workers import start_worker, stop
from tests.acceptance.workapp import add, async_add, boom, brief, doomed, huge


def _load(conn: psycopg.Connection[Any], producer: App, calls: list[rota.TaskCall]) -> list[Any]:
    """Straight into PostgreSQL, in this connection's transaction."""
    return producer.enqueue_many(calls, connection=conn)


def test_results_from_a_worker_process(
    env: dict[str, str], settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    producer = App(settings.model_copy(update={"max_result_bytes": 4096}))
    env = {**env, "ROTA_MAX_RESULT_BYTES": "4096"}
    worker = start_worker(env, "--concurrency", "4")
    try:
        first = producer.result(_load(conn, producer, [add.using(tenant="a").prepare(2, 3)])[0])
        # Waited for from here, while the worker runs it: woken by NOTIFY.
        assert first.get(timeout=30) == {"sum": 5, "attempt": 1}
        assert first.status() == "succeeded"

        async_id, huge_id, doomed_id, boom_id = _load(
            conn,
            producer,
            [
                async_add.using(tenant="a").prepare(20, 22),
                huge.using(tenant="b").prepare(10_000),
                doomed.using(tenant="b").prepare(),
                boom.using(tenant="c").prepare(),
            ],
        )
        assert asyncio.run(producer.result(async_id).aget(timeout=30)) == 42
        # Too big to keep: the task succeeded all the same, and says why.
        with pytest.raises(rota.ResultNotKept, match="over ROTA_MAX_RESULT_BYTES"):
            producer.result(huge_id).get(timeout=30)
        assert db.run(conn, core.task_states([huge_id]))[huge_id].status == "succeeded"
        # Dead: its last error and traceback.
        with pytest.raises(rota.TaskFailed) as failed:
            producer.result(doomed_id).get(timeout=30)
        assert "doomed from the start" in (failed.value.error or "")
        assert "RuntimeError" in (failed.value.traceback or "")
        # A task that keeps no result says so once it ended.
        deadline = time.monotonic() + 30
        while producer.result(boom_id).status() != "dead":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with pytest.raises(rota.TaskFailed):
            producer.result(boom_id).get(timeout=1)

        # Past its result_ttl: expired, not unknown; pruning keeps the row
        # that says so while the task's record lasts.
        brief_id = _load(conn, producer, [brief.using(tenant="a").prepare()])[0]
        assert producer.result(brief_id).get(timeout=30) == 7
        time.sleep(0.6)
        assert db.run(conn, prune_results()) >= 1
        with pytest.raises(rota.ResultExpired):
            producer.result(brief_id).get(timeout=1)
        with pytest.raises(TimeoutError):
            producer.result(new_task_id()).get(timeout=0.3)
        assert producer.result(new_task_id()).status() == "unknown"
    finally:
        stop(worker)
        producer.close()


def test_a_result_waited_for_before_the_task_is_loaded(
    env: dict[str, str], settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    """The id comes back from Redis before the loader moved the task: the
    waiter waits through it."""
    worker = start_worker(env, "--concurrency", "2")
    with App(settings) as producer:
        task_id = producer.enqueue("add", [1, 1], tenant="a", queue="work")  # into Redis
        result = producer.result(task_id)
        assert result.status() == "unknown"
        from rota.loader.engine import Loader

        loader = Loader(settings)
        try:
            loader.drain()
        finally:
            loader.close()
        try:
            assert result.get(timeout=30) == {"sum": 2, "attempt": 1}
        finally:
            stop(worker)
