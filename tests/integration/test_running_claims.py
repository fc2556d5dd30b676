"""Running versus claimed, not started (prefetched), and a run's start
recorded with its completion, with a real worker: every surface (the read
model, the console's pages and API, the CLI, the metrics) reads them from
one definition (rota.claims), and a finished task keeps when it was claimed,
when it started and how long it ran, as its worker measured."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rota import App, Settings, core
from rota.consumer.worker import Worker
from rota.core import db, read
from rota.readmodel.story import task_story
from tests.helpers import claim, envelopes, load, wait_for
from tests.integration.test_cli_errors import rota
from tests.integration.test_cli_operations import env_of, run_json
from tests.integration.test_dashboard import TOKEN, Console

Conn = psycopg.Connection[Any]
CONCURRENCY, BATCH = 2, 4
CLAIMS = CONCURRENCY + BATCH  # what the worker holds: its slots and one batch beyond


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """Beats often: the heartbeat marks the runs started."""
    return settings.model_copy(update={"heartbeat_seconds": 0.2, "poll_seconds": 0.2})


@pytest.fixture
def held(fast: Settings) -> Iterator[tuple[App, threading.Event]]:
    """An app whose task `hold` runs until the event is set."""
    app = App(fast)
    release = threading.Event()

    @app.task(queue="held")
    def hold(n: int) -> int:
        release.wait(60)
        return n

    @app.task(queue="quick")
    def quick(n: int) -> int:
        time.sleep(0.05)
        return n

    yield app, release
    release.set()
    app.close()


class Running:
    """A worker running in a thread, stopped at the end."""

    def __init__(self, app: App, queues: list[str], concurrency: int, batch: int) -> None:
        self.worker = Worker(
            app, queues=queues, concurrency=concurrency, batch_size=batch, maintenance=False
        )
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(self, *_: Any) -> None:
        self.worker.stop()
        self.thread.join(timeout=30)


def claims(conn: Conn) -> list[tuple[Any, bool, datetime | None]]:
    """(task id, running, started_at) of every claim, as rota.claims tells them."""
    return conn.execute(
        "SELECT task_id, running, started_at FROM rota.claims ORDER BY claimed_at, vtime, seq"
    ).fetchall()


def finished(conn: Conn, task_id: Any) -> tuple[datetime, datetime, float | None]:
    row = conn.execute(
        "SELECT claimed_at, started_at, ran_seconds FROM rota.finished WHERE task_id = %s",
        [task_id],
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def columns(text: str, first: str) -> dict[str, str]:
    """The first row of a CLI table whose first header is `first`, by header
    (columns are two spaces or more apart; a header may hold one)."""
    lines = text.splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith(first + " "))
    heads = list(re.finditer(r"\S+(?: \S+)*", lines[at]))
    row = lines[at + 1]
    ends = [h.start() for h in heads[1:]] + [len(row)]
    return {h.group(): row[h.start() : end].strip() for h, end in zip(heads, ends, strict=True)}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_every_surface_shows_a_workers_concurrency_running_and_the_rest_prefetched(
    held: tuple[App, threading.Event], fast: Settings, conn: Conn
) -> None:
    app, release = held
    hold = app.tasks["hold"]
    ids = [hold.using(tenant="acme", connection=conn).enqueue(n) for n in range(CLAIMS)]
    with Running(app, ["held"], CONCURRENCY, BATCH) as worker:
        # Every task claimed, and the heartbeat has told which two started.
        wait_for(
            lambda: (
                len(found := claims(conn)) == CLAIMS
                and sum(started is not None for _, _, started in found) == CONCURRENCY
            ),
            what="the worker to hold its claims and its heartbeat to tell the starts",
        )
        found = claims(conn)
        running = [task for task, runs, _ in found if runs]
        prefetched = [task for task, runs, _ in found if not runs]
        assert len(running) == CONCURRENCY and len(prefetched) == BATCH
        # The two told started are the two running; the others are not known started.
        assert all((started is not None) == runs for _, runs, started in found)
        db.run(conn, core.refresh_stats())

        # The read model.
        (queue,) = [q for q in db.run(conn, read.queues()) if q.name == "held"]
        assert (queue.running, queue.prefetched) == (CONCURRENCY, BATCH)
        (mine,) = [w for w in db.run(conn, read.workers()) if w.id == worker.id]
        assert (mine.running, mine.prefetched) == (CONCURRENCY, BATCH)
        (acme,) = db.run(conn, read.tenants()).rows
        assert (acme.running, acme.prefetched, acme.claimed) == (CONCURRENCY, BATCH, CLAIMS)
        listed = db.run(conn, read.tasks("running"))
        assert {t.id for t in listed} == set(running)
        assert {t.state for t in listed} == {"running"}
        assert {(t.attempts, t.max_attempts) for t in listed} == {(1, 3)}  # the attempt run
        waiting = db.run(conn, read.tasks("claimed"))
        assert {t.id for t in waiting} == set(prefetched)
        assert {t.state for t in waiting} == {"claimed"}
        story = task_story(conn, None, fast, running[0])
        assert story.where == "running"
        assert story.why.startswith(f"running on worker {worker.id} since ")
        assert story.run is not None and story.run.ran.endswith(" so far")
        story = task_story(conn, None, fast, prefetched[0])
        assert story.where == "claimed"
        assert story.why.startswith(
            f"claimed by worker {worker.id}, waiting for a free slot (prefetched) for "
        )

        # The console's pages, its API and its metrics.
        console_settings = fast.model_copy(update={"dashboard_token": TOKEN})
        with (
            Console(console_settings) as console,
            httpx.Client(
                base_url=console.url, headers={"Authorization": f"Bearer {TOKEN}"}
            ) as http,
        ):
            page = http.get("/").text
            assert re.search(rf'id="total-running">{CONCURRENCY}<', page)
            assert re.search(rf'id="total-prefetched">{BATCH}<', page)
            page = http.get("/tasks", params={"state": "running"}).text
            assert sorted(re.findall(r'href="/tasks/([0-9a-f-]{36})"', page)) == sorted(
                str(t) for t in running
            )
            assert page.count("<td>1/3</td>") == CONCURRENCY
            page = http.get("/tasks", params={"state": "claimed"}).text
            assert len(re.findall(r'href="/tasks/([0-9a-f-]{36})"', page)) == BATCH
            page = http.get("/workers").text
            assert f'<td class="num">{CONCURRENCY} / {CONCURRENCY}</td>' in page
            assert f'<td class="num">{BATCH}</td>' in page
            page = http.get("/tenants").text
            assert f'<td class="num">{CONCURRENCY}</td><td class="num">{CLAIMS}</td>' in page
            page = http.get(f"/tasks/{prefetched[0]}").text
            assert 'id="where">claimed<' in page
            assert 'id="started-at">not started (prefetched)<' in page

            overview = http.get("/api/overview").json()
            (api_queue,) = [q for q in overview["queues"] if q["name"] == "held"]
            assert (api_queue["running"], api_queue["prefetched"]) == (CONCURRENCY, BATCH)
            (api_worker,) = [w for w in overview["workers"] if w["id"] == worker.id]
            assert (api_worker["running"], api_worker["prefetched"]) == (CONCURRENCY, BATCH)
            (api_tenant,) = overview["tenants"]
            assert (api_tenant["running"], api_tenant["prefetched"]) == (CONCURRENCY, BATCH)
            (api_row,) = http.get("/api/tenants").json()["tenants"]
            assert (api_row["running"], api_row["prefetched"], api_row["claimed"]) == (
                CONCURRENCY,
                BATCH,
                CLAIMS,
            )
            api_running = http.get("/api/tasks", params={"state": "running"}).json()["tasks"]
            assert len(api_running) == CONCURRENCY
            api_claimed = http.get("/api/tasks", params={"state": "claimed"}).json()["tasks"]
            assert len(api_claimed) == BATCH
            assert http.get(f"/api/tasks/{prefetched[0]}").json()["where"] == "claimed"

            metrics = samples(http.get("/metrics").text)
            assert metrics[("rota_tasks_running", ())] == CONCURRENCY
            assert metrics[("rota_tasks_claimed_not_started", ())] == BATCH
            held_running = ("rota_queue_tasks", (("queue", "held"), ("state", "running")))
            held_claimed = ("rota_queue_tasks", (("queue", "held"), ("state", "claimed")))
            assert metrics[held_running] == CONCURRENCY
            assert metrics[held_claimed] == BATCH

        # The CLI.
        shown = rota("tenant", "list", **env_of(fast))
        assert shown.returncode == 0, shown.stderr
        acme_row = columns(shown.stdout, "tenant")
        assert acme_row["tenant"] == "acme"
        assert (acme_row["running"], acme_row["claimed/limit"]) == (str(CONCURRENCY), str(CLAIMS))
        assert len(run_json(fast, "tasks", "--state", "running")) == CONCURRENCY
        assert len(run_json(fast, "tasks", "--state", "claimed")) == BATCH
        story_json = run_json(fast, "task", "show", str(prefetched[0]))
        assert story_json["where"] == "claimed"
        assert story_json["run"]["started_at"] == "not started (prefetched)"
        stats = run_json(fast, "stats")
        (stats_queue,) = [q for q in stats["queues"] if q["name"] == "held"]
        assert (stats_queue["running"], stats_queue["prefetched"]) == (CONCURRENCY, BATCH)

        # Released, the prefetched tasks start once slots free: each records
        # a start after its claim, at or after the release.
        released = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        release.set()
        wait_for(
            lambda: conn.execute("SELECT count(*) FROM rota.finished").fetchone()[0] == CLAIMS,  # type: ignore[index]
            what="every task to finish",
        )
    for task_id in prefetched:
        claimed_at, started_at, ran = finished(conn, task_id)
        assert started_at >= released > claimed_at
        assert ran is not None and 0 <= ran < 30
    for task_id in running:
        claimed_at, started_at, ran = finished(conn, task_id)
        assert claimed_at <= started_at < released
        assert ran is not None and ran > 0
    assert {str(i) for i in ids} == {str(t) for t in running + prefetched}


def test_a_50_ms_task_ran_about_0_05_s_and_says_so(
    held: tuple[App, threading.Event], fast: Settings, conn: Conn
) -> None:
    app, _release = held
    quick = app.tasks["quick"]
    ids = [quick.using(tenant="acme", connection=conn).enqueue(n) for n in range(4)]
    with Running(app, ["quick"], 1, 4):
        wait_for(
            lambda: conn.execute("SELECT count(*) FROM rota.finished").fetchone()[0] == 4,  # type: ignore[index]
            what="the quick tasks to finish",
        )
    runs = [finished(conn, task_id) for task_id in ids]
    for claimed_at, started_at, ran in runs:
        # Measured by the worker: about the task's 50 ms sleep (bounded
        # loosely: this is what it records, not how fast it is).
        assert ran is not None and 0.04 <= ran <= 0.5
        assert started_at >= claimed_at
    # One slot: the last of one claim waited, prefetched, for the runs before it.
    last_claimed, last_started, _ = max(runs, key=lambda r: r[1])
    assert last_started - last_claimed >= timedelta(seconds=0.04)
    story = task_story(conn, None, fast, ids[0])
    assert story.where == "succeeded" and story.run is not None
    assert re.fullmatch(r"0\.0[4-9]\d? s|0\.[1-5]\d? s", story.run.ran)
    assert f"ran {story.run.ran}" in story.why


def test_an_old_workers_completion_records_its_claim_as_its_start(
    settings: Settings, conn: Conn
) -> None:
    load(conn, envelopes("alice", 1))
    (task,) = claim(conn, 1)
    claimed_at = conn.execute(
        "SELECT claimed_at FROM rota.running WHERE task_id = %s", [task.id]
    ).fetchone()[0]  # type: ignore[index]
    # The previous release's call: two arguments.
    done = conn.execute(
        "SELECT * FROM rota.complete(%s::uuid[], %s::integer[])", [[task.id], [task.attempt]]
    ).fetchall()
    assert done == [(task.id,)]
    assert finished(conn, task.id) == (claimed_at, claimed_at, None)
    story = task_story(conn, None, settings, task.id)
    assert story.run is not None
    at = claimed_at.isoformat(timespec="milliseconds")
    assert (story.run.started_at, story.run.ran) == (
        f"not recorded (claimed at {at})",
        "not recorded",
    )


def test_a_completion_keeps_the_workers_measures_and_the_heartbeats_start(conn: Conn) -> None:
    load(conn, envelopes("alice", 3))
    first, second, third = claim(conn, 3)
    claimed_at = conn.execute(
        "SELECT claimed_at FROM rota.running WHERE task_id = %s", [first.id]
    ).fetchone()[0]  # type: ignore[index]
    # The heartbeat marks started what started (once: a later beat keeps it).
    held = db.transact(
        conn,
        core.extend_leases(
            [first.token, second.token, third.token], 60, started={first.id: 1.5, second.id: 2.0}
        ),
    )
    assert held == {first.id, second.id, third.id}
    db.transact(conn, core.extend_leases([first.token], 60, started={first.id: 9.0}))
    starts = dict(conn.execute("SELECT task_id, started_at FROM rota.running").fetchall())
    assert starts[first.id] == claimed_at + timedelta(seconds=1.5)
    assert starts[third.id] is None
    runs = {first.id: (1.5, 0.25)}
    assert db.transact(conn, core.complete([first.token, second.token], runs=runs)) == {
        first.id,
        second.id,
    }
    assert finished(conn, first.id) == (
        claimed_at,
        claimed_at + timedelta(seconds=1.5),
        0.25,
    )
    # No measure in the completion: the heartbeat's start stays.
    second_claimed, second_started, second_ran = finished(conn, second.id)
    assert (second_started - second_claimed, second_ran) == (timedelta(seconds=2.0), None)


def test_the_waits_counted_for_the_charts_run_to_the_start(conn: Conn) -> None:
    load(conn, envelopes("alice", 1))
    (task,) = claim(conn, 1)
    enqueued_at, claimed_at = conn.execute(
        "SELECT t.enqueued_at, r.claimed_at FROM rota.tasks t"
        " JOIN rota.running r ON r.task_id = t.id WHERE t.id = %s",
        [task.id],
    ).fetchone()  # type: ignore[misc]
    # It sat prefetched for 7 s before it started.
    db.transact(conn, core.complete([task.token], runs={task.id: (7.0, 0.1)}))
    counted = db.run(conn, core.count_service(claimed_at + timedelta(minutes=2)))
    assert counted == 1
    (waited,) = conn.execute("SELECT sum(wait_seconds) FROM rota.service").fetchone()  # type: ignore[misc]
    expected = (claimed_at + timedelta(seconds=7) - enqueued_at).total_seconds()
    assert waited == pytest.approx(expected, abs=1e-3)
