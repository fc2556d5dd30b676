"""Tenant isolation against real Redis and PostgreSQL: bad input, Redis
refusing writes, and shared resources with bounds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
import psycopg
import pytest
import redis

from rota import App, CapacityExceeded, EnqueueError, InvalidName, Settings, core
from rota.buffer.entries import TaskBatch
from rota.buffer.streams import ENTRY_VERSION, all_streams, backlog_key, dead_letter_stream
from rota.core import db
from rota.loader import Loader
from rota.model.envelope import TaskEnvelope, envelope_template, make_envelope
from tests.helpers import wait_for

Conn = psycopg.Connection[Any]


def _client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(settings.redis_url)


def _with(settings: Settings, **changes: Any) -> Settings:
    return settings.model_copy(update=changes)


@pytest.fixture
def redis_admin(settings: Settings) -> Iterator[redis.Redis]:
    """The test Redis; any memory limit a test sets is lifted afterwards."""
    client = _client(settings)
    yield client
    client.config_set("maxmemory", 0)
    client.close()


def _refuse_writes(client: redis.Redis) -> None:
    """Redis out of memory: every command that needs memory is refused (OOM)."""
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)


def _dead_letters(settings: Settings) -> list[dict[bytes, bytes]]:
    stream = dead_letter_stream(settings.stream_prefix)
    return [fields for _, fields in _client(settings).xrange(stream)]


def _pending(settings: Settings) -> int:
    client = _client(settings)
    return sum(
        int(client.xpending(s, settings.loader_group)["pending"])
        for s in all_streams(settings.stream_prefix, settings.shards)
    )


def _buffered(settings: Settings) -> int:
    client = _client(settings)
    return sum(int(client.xlen(s)) for s in all_streams(settings.stream_prefix, settings.shards))


def _task_count(conn: Conn) -> int:
    ((count,),) = conn.execute("SELECT count(*) FROM rota.tasks").fetchall()
    return int(count)


def _raw_entry(settings: Settings, columns: dict[str, Any], tenant: str = "alice") -> None:
    """Writes a buffer entry as a producer of any language might."""
    from rota.buffer.streams import shard_for, stream_name

    stream = stream_name(settings.stream_prefix, shard_for(tenant, settings.shards))
    _client(settings).xadd(stream, {b"v": ENTRY_VERSION, b"tasks": orjson.dumps(columns)})


def _columns(tenants: list[str], queue: str = "pdfs") -> dict[str, Any]:
    batch = TaskBatch(datetime.now(UTC))
    template = envelope_template("parse_pdf", queue, 2, 1.0, 60.0)
    for i, tenant in enumerate(tenants):
        batch.add(template, tenant, [f"{i}.pdf"])
    columns: dict[str, Any] = orjson.loads(batch.to_json())
    return columns


def test_redis_out_of_memory_falls_back_to_postgresql(
    app: App, settings: Settings, conn: Conn, redis_admin: redis.Redis
) -> None:
    _refuse_writes(redis_admin)
    parse_pdf = app.tasks["parse_pdf"]
    ids = [
        parse_pdf.using(tenant="alice").enqueue(f"{i}.pdf")
        for i in range(settings.breaker_failures)
    ]
    states = db.run(conn, core.task_states(ids))
    assert {states[i].status for i in ids} == {"pending"}  # stored in PostgreSQL
    assert app.producer.core.fallbacks == len(ids)
    assert app.producer.core.breaker.state.value == "open"  # counted like a lost Redis


def test_an_unexpected_redis_refusal_is_an_enqueue_error(settings: Settings, conn: Conn) -> None:
    admin = _client(settings)
    admin.acl_setuser(
        "no_xadd", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-xadd"]
    )
    address = settings.redis_url.split("//", 1)[1]
    limited = App(_with(settings, redis_url=f"redis://no_xadd:pw@{address}"))
    try:
        with pytest.raises(EnqueueError, match="refused the write"):
            limited.enqueue("x.y", queue="pdfs", tenant="alice")
    finally:
        limited.close()
        admin.acl_deluser("no_xadd")
    assert _task_count(conn) == 0


def test_the_loader_acknowledges_nothing_it_could_not_dead_letter(
    settings: Settings, conn: Conn, redis_admin: redis.Redis
) -> None:
    columns = _columns(["alice", "alice"])
    columns["tenant"][1] = "alice\n"  # this task is refused, its sibling loaded
    _raw_entry(settings, columns)
    loader = Loader(settings)
    try:
        loader.ensure_groups()
        _refuse_writes(redis_admin)
        result = loader.pass_once()
        assert result.loaded == 1  # the good task is in PostgreSQL...
        assert _pending(settings) == 1  # ...and the entry was kept: its dead letter was refused
        assert _buffered(settings) == 1
        redis_admin.config_set("maxmemory", 0)
        deadline = time.monotonic() + 30
        while (result := loader.pass_once()).reclaimed == 0:  # once idle long enough
            assert time.monotonic() < deadline
        assert result.loaded == 0 and result.duplicates == 1
    finally:
        loader.close()
    assert _pending(settings) == 0 and _buffered(settings) == 0
    (letter,) = _dead_letters(settings)
    assert b"tenant" in letter[b"reason"]
    assert _task_count(conn) == 1


def test_a_tenants_capacity_counts_what_it_has_in_the_buffer(
    app: App, settings: Settings, conn: Conn
) -> None:
    db.transact(conn, core.configure_tenant("small", capacity=10))
    parse_pdf = app.tasks["parse_pdf"]
    accepted = 0
    for i in range(40):  # no loader running: everything stays in the buffer
        try:
            parse_pdf.using(tenant="small").enqueue(f"{i}.pdf")
        except CapacityExceeded:
            continue
        accepted += 1
    assert accepted == 10
    parse_pdf.using(tenant="big").enqueue("other.pdf")  # other tenants are not limited by it
    loader = Loader(settings)
    try:
        assert loader.drain().drained
    finally:
        loader.close()
    # Loaded: the buffer's count is gone, PostgreSQL's backlog holds the same 10.
    keys = [backlog_key(s) for s in all_streams(settings.stream_prefix, settings.shards)]
    assert not any(_client(settings).exists(key) for key in keys)
    with pytest.raises(CapacityExceeded):
        parse_pdf.using(tenant="small").enqueue("more.pdf")
    tasks = db.run(conn, core.claim(["pdfs"], 20, "w"))
    db.run(conn, core.complete(t.token for t in tasks))

    def accepted() -> bool:  # once a refresh (beside the enqueues) has read it
        try:
            parse_pdf.using(tenant="small").enqueue("more.pdf")
        except CapacityExceeded:
            return False
        return True

    wait_for(accepted, what="the freed capacity to be read")


def test_loading_takes_a_limited_tenants_work_off_the_buffers_count(
    app: App, settings: Settings, conn: Conn
) -> None:
    """While the buffer still holds entries (no pass has found it empty, which
    resets the counts), each load lowers the counts by what it took."""
    db.transact(conn, core.configure_tenant("small", capacity=10))
    parse_pdf = app.tasks["parse_pdf"]
    for i in range(6):
        parse_pdf.using(tenant="small").enqueue(f"{i}.pdf")
    parse_pdf.using(tenant="big").enqueue("other.pdf")
    keys = [backlog_key(s) for s in all_streams(settings.stream_prefix, settings.shards)]

    def counted() -> float:
        client = _client(settings)
        return sum(float(client.hget(key, "small") or 0) for key in keys)

    assert counted() == 6
    # The refresh under way reads PostgreSQL before the load (after it, it
    # would count the loaded tasks twice until the next: more back-pressure).
    wait_for(lambda: app.producer.core.refreshing is None, what="the refresh to land")
    loader = Loader(settings)
    try:
        assert loader.pass_once().loaded == 7
    finally:
        loader.close()
    assert counted() == 0
    # Its 6 tasks now wait in PostgreSQL, counted once: 4 more fit.
    for i in range(4):
        parse_pdf.using(tenant="small").enqueue(f"again-{i}.pdf")
    with pytest.raises(CapacityExceeded):
        parse_pdf.using(tenant="small").enqueue("more.pdf")


def test_a_full_buffer_sends_enqueues_to_postgresql(settings: Settings, conn: Conn) -> None:
    app = App(_with(settings, buffer_max_entries=5, shards=1))
    try:
        ids = [app.enqueue("x.y", queue="pdfs", tenant=f"t{i}") for i in range(8)]
    finally:
        app.close()
    assert _buffered(settings) == 5
    assert _task_count(conn) == 3
    assert len(set(ids)) == 8


def test_queues_outside_the_allow_list_are_dead_lettered_by_the_loader(
    settings: Settings, conn: Conn
) -> None:
    _raw_entry(settings, _columns(["alice", "alice"], queue="elsewhere"))
    _raw_entry(settings, _columns(["alice"], queue="pdfs"))
    loader = Loader(_with(settings, queues="pdfs"))
    try:
        summary = loader.drain()
    finally:
        loader.close()
    assert (summary.loaded, summary.dead_lettered) == (1, 2)
    reasons = {letter[b"reason"] for letter in _dead_letters(settings)}
    assert reasons == {b"queue 'elsewhere' is not in ROTA_QUEUES"}


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("enqueued_at", "9999-12-31T23:00:00-14:00", b"2200"),
        ("eta", ["2030-01-01T00:00:00"], b"timezone"),
        ("cost", ["5"], b"cost"),
        ("payload", ['{"args": [123456789012345678901234567890], "kwargs": {}}'], b"64 bits"),
        ("templates", [["parse_pdf", "pdfs", 3, 1e300, 60.0]], b"backoff"),
        ("tenant", ["alice\n"], b"tenant"),
    ],
)
def test_raw_entries_out_of_bounds_are_dead_lettered_with_the_reason(
    settings: Settings, conn: Conn, column: str, value: Any, says: bytes
) -> None:
    columns = _columns(["alice"])
    columns[column] = value
    _raw_entry(settings, columns)
    loader = Loader(settings)
    try:
        summary = loader.drain()
    finally:
        loader.close()
    assert summary.drained and (summary.loaded, summary.dead_lettered) == (0, 1)
    (letter,) = _dead_letters(settings)
    assert says in letter[b"reason"]
    assert _task_count(conn) == 0


def test_the_transactional_path_checks_names_like_the_buffer(app: App, conn: Conn) -> None:
    with pytest.raises(InvalidName):
        app.tasks["parse_pdf"].using(tenant="alice\n", connection=conn).enqueue("a.pdf")
    assert _task_count(conn) == 0


@pytest.mark.parametrize(
    "change",
    [
        {"name": "evil\n"},
        {"max_attempts": 10**6},
        {"backoff_base": 1e300},
        {"eta": datetime(9999, 1, 1, tzinfo=UTC)},
        {"enqueued_at": datetime(1970, 1, 1, tzinfo=UTC)},
    ],
)
def test_the_database_checks_are_the_last_line(conn: Conn, change: dict[str, Any]) -> None:
    good = make_envelope(name="t", queue="q", tenant="alice")
    fields = {f: getattr(good, f) for f in TaskEnvelope.__dataclass_fields__}
    bad = TaskEnvelope(**{**fields, **change})  # past every Python check
    with pytest.raises(psycopg.errors.CheckViolation):
        db.transact(conn, core.load([bad]))


@pytest.mark.parametrize(
    "column_value",
    ["concurrency_limit = 2000000", "rate_limit = 1e7", "rate_burst = 1e10", "capacity = 1e13"],
)
def test_tenant_settings_are_checked_by_the_database_too(conn: Conn, column_value: str) -> None:
    db.transact(conn, core.configure_tenant("alice"))
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(f"UPDATE rota.tenants SET {column_value} WHERE name = 'alice'")
