"""The Python loader against real Redis and PostgreSQL."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
import redis

from rota import App, Settings, core
from rota.buffer.entries import TaskBatch
from rota.buffer.streams import ENTRY_VERSION, dead_letter_stream, shard_for, stream_name
from rota.core import db
from rota.core.load import columns_of
from rota.loader import Loader, lambda_handler
from rota.loader.acks import Acknowledger
from rota.loader.reading import Entry
from rota.loader.store import load_in_chunks
from rota.model.envelope import envelope_template
from tests.helpers import pending_idle_past_reclaim, wait_for

Conn = psycopg.Connection[Any]


def _client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(settings.redis_url)


def _dead(settings: Settings) -> list[dict[bytes, bytes]]:
    return [
        fields for _, fields in _client(settings).xrange(dead_letter_stream(settings.stream_prefix))
    ]


def test_malformed_entries_go_to_the_dead_letter_stream_with_a_reason(
    app: App, settings: Settings, conn: Conn
) -> None:
    client = _client(settings)
    shard = stream_name(settings.stream_prefix, 0)
    batch = TaskBatch(datetime.now(UTC))
    for tenant in ("alice", "bob"):
        batch.add(envelope_template("x.y", "q"), tenant)
    mixed = json.loads(batch.to_json())
    mixed["tenant"][1] = "no spaces allowed"
    client.xadd(shard, {b"v": ENTRY_VERSION, b"tasks": json.dumps(mixed).encode()})
    client.xadd(shard, {b"v": ENTRY_VERSION, b"tasks": b"{not json"})
    client.xadd(shard, {b"v": b"99", b"tasks": b"[]"})
    client.xadd(shard, {b"something": b"else"})
    loader = Loader(settings)
    summary = loader.drain()
    loader.close()
    assert (summary.loaded, summary.dead_lettered, summary.drained) == (1, 4, True)
    reasons = sorted(d[b"reason"].decode() for d in _dead(settings))
    assert any("tenant" in r for r in reasons)
    assert any("not JSON" in r for r in reasons)
    assert sum("unknown entry format" in r for r in reasons) == 2
    assert all(d[b"stream"] == shard.encode() for d in _dead(settings))
    assert db.run(conn, core.queue_counts())["q"]["ready"] == 1
    assert client.xlen(shard) == 0  # acknowledged and deleted


def test_an_entry_loaded_twice_creates_its_tasks_once(
    app: App, settings: Settings, conn: Conn
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    app.enqueue_many([parse_pdf.using(tenant="alice").prepare(f"{i}") for i in range(10)])
    first = Loader(settings, consumer="first")
    first.ensure_groups()
    # Loaded and committed, but the loader "dies" before acknowledging.
    entries = first.reader.read_new(None)
    envelopes = [e for entry in entries for e in _decode(entry, settings)]
    stored = load_in_chunks(first.conn, columns_of(envelopes), settings.loader_batch_size)
    assert stored == (10, [])
    first.close()
    wait_for(lambda: pending_idle_past_reclaim(settings), what="the entry to be idle")
    second = Loader(settings, consumer="second")
    summary = second.drain()
    second.close()
    assert (summary.reclaimed, summary.loaded, summary.duplicates) == (1, 0, 10)
    assert db.run(conn, core.queue_counts())["pdfs"]["ready"] == 10


def test_a_pass_of_several_chunks_keeps_each_tenants_order(
    app: App, settings: Settings, conn: Conn
) -> None:
    settings = settings.model_copy(update={"loader_batch_size": 10})
    parse_pdf = app.tasks["parse_pdf"]
    app.enqueue_many([parse_pdf.using(tenant="alice").prepare(i) for i in range(35)])
    loader = Loader(settings)
    result = loader.pass_once()
    loader.close()
    assert result.loaded == 35  # one pass, four chunks
    claimed = db.run(conn, core.claim(["pdfs"], 35, "w"))
    assert [t.args[0] for t in claimed] == list(range(35))


def test_a_pass_woken_by_a_write_over_several_shards_loads_all_of_it(
    settings: Settings, conn: Conn
) -> None:
    # A blocked XREADGROUP is answered with only the stream that woke it.
    settings = settings.model_copy(update={"shards": 4})
    tenants = {}
    for i in range(100):
        tenants.setdefault(shard_for(f"t{i}", 4), f"t{i}")
    spread_app, loader = App(settings), Loader(settings)
    try:
        work = spread_app.task(name="spread.work", queue="q")(lambda: None)
        loader.ensure_groups()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            passing = pool.submit(loader.pass_once, 10_000)
            wait_for(
                lambda: _client(settings).info("clients")["blocked_clients"] == 1,
                what="the loader to block on the buffer",
            )
            spread_app.enqueue_many([work.using(tenant=t).prepare() for t in tenants.values()])
            result = passing.result(timeout=30)
    finally:
        loader.close()
        spread_app.close()
    assert (result.entries, result.loaded) == (4, 4)
    assert db.run(conn, core.queue_counts())["q"]["ready"] == 4


def _decode(entry: Any, settings: Settings) -> list[Any]:
    from rota.buffer.streams import decode_entry

    batch, bad = decode_entry(entry[2], settings.max_payload_bytes)
    assert not bad
    return batch.envelopes()


def test_entries_delivered_too_often_are_dead_lettered(app: App, settings: Settings) -> None:
    settings = settings.model_copy(update={"loader_max_deliveries": 2})
    app.tasks["parse_pdf"].using(tenant="alice").enqueue("a")
    loaders = [Loader(settings, consumer=f"c{i}") for i in range(3)]
    loaders[0].ensure_groups()
    loaders[0].reader.read_new(None)  # delivery 1, never loaded
    for loader in loaders[1:]:
        wait_for(lambda: pending_idle_past_reclaim(settings), what="the entry to be idle")
        loader.reader.reclaim()  # deliveries 2 and 3, never loaded
    wait_for(lambda: pending_idle_past_reclaim(settings), what="the entry to be idle")
    summary = loaders[0].drain()
    for loader in loaders:
        loader.close()
    assert summary.dead_lettered == 1
    assert b"delivered more than 2 times" in _dead(settings)[0][b"reason"]


def test_lambda_handler_drains_within_the_time_left(
    app: App, settings: Settings, conn: Conn, monkeypatch: Any
) -> None:
    for key, value in {
        "ROTA_DATABASE_URL": settings.database_url,
        "ROTA_REDIS_URL": settings.redis_url,
        "ROTA_SHARDS": "4",
    }.items():
        monkeypatch.setenv(key, value)
    app.enqueue_many([app.tasks["parse_pdf"].using(tenant="t").prepare("a") for _ in range(50)])

    class Context:
        def get_remaining_time_in_millis(self) -> int:
            return 60_000

    result = lambda_handler({}, Context())
    assert (result["loaded"], result["drained"], result["exit_code"]) == (50, True, 0)
    assert lambda_handler({"max_seconds": 0}, Context())["exit_code"] == 2


def test_rota_loader_drain_reports_json_and_an_exit_code(app: App, settings: Settings) -> None:
    app.enqueue_many([app.tasks["parse_pdf"].using(tenant="t").prepare("a") for _ in range(7)])
    env = {
        "ROTA_DATABASE_URL": settings.database_url,
        "ROTA_REDIS_URL": settings.redis_url,
        "ROTA_SHARDS": "4",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-m", "rota", "loader", "drain"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["loaded"] == 7
    env["ROTA_DATABASE_URL"] = "postgresql://rota@127.0.0.1:1/none"
    app.enqueue_many([app.tasks["parse_pdf"].using(tenant="t").prepare("a")])
    failed = subprocess.run(
        [sys.executable, "-m", "rota", "loader", "drain"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["errors"]


def test_rota_stats_as_json_and_prometheus(app: App, settings: Settings) -> None:
    app.tasks["parse_pdf"].using(tenant="alice").enqueue("a")
    env = {
        "ROTA_DATABASE_URL": settings.database_url,
        "ROTA_REDIS_URL": settings.redis_url,
        "ROTA_SHARDS": "4",
        "PATH": "/usr/bin:/bin",
    }
    as_json = subprocess.run(
        [sys.executable, "-m", "rota", "stats", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    stats = json.loads(as_json.stdout)
    assert sum(s["entries"] for s in stats["buffer"].values()) == 1
    prom = subprocess.run(
        [sys.executable, "-m", "rota", "stats", "--format", "prometheus"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "rota_buffer_oldest_age_seconds{shard=" in prom.stdout


def test_buffer_stats_show_depth_and_age(app: App, settings: Settings) -> None:
    app.tasks["parse_pdf"].using(tenant="alice").enqueue("a")
    loader = Loader(settings)
    stats = wait_for(
        lambda: (
            (s := loader.buffer_stats())
            and any(shard["oldest_age_seconds"] >= 0.05 for shard in s.values())
            and s
        ),
        what="the entry to age",
    )
    loader.close()
    assert sum(s["entries"] for s in stats.values()) == 1
    assert max(s["oldest_age_seconds"] for s in stats.values()) >= 0.05


def test_loads_are_claimable_before_their_flush_and_acknowledged_only_after_it(
    app: App, settings: Settings, conn: Conn, monkeypatch: Any
) -> None:
    # A slow fsync must not delay a task's start, nor may the buffer forget a
    # task PostgreSQL could still lose: the loader commits without waiting
    # for the WAL flush, then waits for it once before it acknowledges.
    app.tasks["parse_pdf"].using(tenant="alice").enqueue("a.pdf")
    loader = Loader(settings)
    events: list[str] = []
    flush, finish = core.flush_commits, loader.settle.finish

    def flushing() -> Any:
        events.append("flush")
        return flush()

    def acknowledging(*args: Any, **kwargs: Any) -> None:
        setting = loader.conn.execute("SHOW synchronous_commit").fetchone()
        events.append(f"ack (loads' synchronous_commit {setting[0] if setting else None})")
        finish(*args, **kwargs)

    monkeypatch.setattr(core, "flush_commits", flushing)
    monkeypatch.setattr(loader.settle, "finish", acknowledging)
    try:
        assert loader.drain().loaded == 1
    finally:
        loader.close()
    assert events[:2] == ["flush", "ack (loads' synchronous_commit off)"]
    assert db.run(conn, core.queue_counts())["pdfs"]["ready"] == 1


def test_flush_commits_returns_with_the_connections_commits_flushed(
    settings: Settings, conn: Conn
) -> None:
    with db.connect(settings.database_url) as loading:
        db.run(loading, core.commit_without_flush())
        loading.execute("SELECT pg_current_xact_id()")  # commits a record, not waiting for it
        (committed,) = loading.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone() or [
            None
        ]
        db.run(loading, core.flush_commits())
        flushed = conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", [committed])
        assert flushed.fetchone() == (True,)
        # The connection's own setting is unchanged: only the flush's commit waited.
        assert loading.execute("SHOW synchronous_commit").fetchone() == ("off",)


def test_a_slow_flush_delays_the_acknowledgement_never_the_next_load(
    app: App, settings: Settings, conn: Conn, monkeypatch: Any
) -> None:
    # The long-running loader waits for the WAL flush on a thread of its
    # own: while a flush hangs (a disk's slow fsync), tasks go on being
    # loaded and claimable, and what they came from stays in the buffer.
    flushing, release = threading.Event(), threading.Event()
    flush = core.flush_commits

    def slow_flush() -> Any:
        flushing.set()
        assert release.wait(30)
        return flush()

    monkeypatch.setattr(core, "flush_commits", slow_flush)
    client = _client(settings)
    pending = lambda: sum(  # noqa: E731
        client.xpending(stream_name(settings.stream_prefix, s), settings.loader_group)["pending"]
        for s in range(settings.shards)
    )
    ready = lambda: db.run(conn, core.queue_counts()).get("pdfs", {}).get("ready", 0)  # noqa: E731
    loader, stop = Loader(settings), threading.Event()
    running = threading.Thread(
        target=loader.run_forever, args=(stop.is_set,), kwargs={"block_ms": 50}
    )
    running.start()
    try:
        parse_pdf = app.tasks["parse_pdf"].using(tenant="alice")
        parse_pdf.enqueue("1.pdf")
        wait_for(
            lambda: ready() == 1 and flushing.is_set(), what="the first load, its flush hanging"
        )
        parse_pdf.enqueue("2.pdf")
        wait_for(lambda: ready() == 2, what="the second load, the flush still hanging")
        assert pending() == 2  # neither acknowledged yet
        release.set()
        wait_for(lambda: pending() == 0, what="both acknowledged after the flush")
    finally:
        release.set()
        stop.set()
        running.join(30)
        loader.close()
    assert not running.is_alive()


def test_a_flush_on_a_connection_lost_since_a_load_began_acknowledges_nothing_of_it(
    settings: Settings, conn: Conn
) -> None:
    # A restart or failover ends every connection, and may have lost the
    # commits not yet flushed: only a flush on a connection opened before a
    # load began, and never lost since, may settle it.
    acks = Acknowledger(settings)
    settled: list[str] = []
    entry: Entry = ("stream", "1-0", {})
    try:
        acks.submit(time.monotonic(), lambda: settled.append("kept"), [])
        assert acks.wait_settled(10) and settled == ["kept"]
        began = time.monotonic()
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name LIKE 'rota-loader%%' AND datname = current_database()"
        )
        acks.submit(began, lambda: settled.append("begun before the loss"), [entry])
        assert acks.wait_settled(30)
        acks.submit(time.monotonic(), lambda: settled.append("begun after"), [])
        assert acks.wait_settled(10)
    finally:
        acks.stop()
    assert settled == ["kept", "begun after"]
    assert acks.take_again() == [entry]  # handed back to the loop, loaded again
