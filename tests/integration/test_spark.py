"""The Spark engine end to end in local mode (slow: one JVM for the module)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from rota import App, Settings, core
from rota.buffer.entries import TaskBatch
from rota.buffer.streams import (
    ENTRY_VERSION,
    all_streams,
    dead_letter_stream,
    shard_for,
    stream_name,
)
from rota.core import db
from rota.model.envelope import envelope_template
from tests.helpers import wait_for

pytestmark = pytest.mark.spark


def test_streaming_loads_once_and_restarts_from_its_checkpoint(
    spark: Any, app: App, settings: Settings, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    from rota.loader.spark import CHECKPOINT_MANAGER, LOCAL_CHECKPOINT_MANAGER, run_streaming

    parse_pdf = app.tasks["parse_pdf"]
    first = app.enqueue_many(
        [parse_pdf.using(tenant=f"t{i % 9}").prepare(str(i)) for i in range(700)]
    )
    first += [parse_pdf.using(tenant="solo").enqueue("one") for _ in range(5)]
    client = redis.Redis.from_url(settings.redis_url)
    client.xadd(stream_name(settings.stream_prefix, 1), {b"v": ENTRY_VERSION, b"tasks": b"[{"})
    checkpoint = str(tmp_path / "checkpoint")

    spark.conf.unset(CHECKPOINT_MANAGER)
    sink = run_streaming(settings, checkpoint=checkpoint, available_now=True, session=spark)
    assert sink.loaded == 705
    # A local checkpoint's logs are written without Hadoop's FileContext.
    assert spark.conf.get(CHECKPOINT_MANAGER) == LOCAL_CHECKPOINT_MANAGER
    assert db.run(conn, core.queue_counts())["pdfs"]["ready"] == 705
    dead = client.xrange(dead_letter_stream(settings.stream_prefix))
    assert len(dead) == 1 and b"not JSON" in dead[0][1][b"reason"]
    shards = all_streams(settings.stream_prefix, settings.shards)
    # Trimmed by the sink once loaded, without waiting for the next batch.
    assert sum(client.xlen(s) for s in shards) == 0

    second = app.enqueue_many([parse_pdf.using(tenant="t1").prepare("late") for _ in range(40)])
    # The restart reads the checkpoint back through a manager the user chose.
    chosen = LOCAL_CHECKPOINT_MANAGER.replace("FileSystemBased", "FileContextBased")
    spark.conf.set(CHECKPOINT_MANAGER, chosen)
    try:
        sink = run_streaming(settings, checkpoint=checkpoint, available_now=True, session=spark)
        assert spark.conf.get(CHECKPOINT_MANAGER) == chosen
    finally:
        spark.conf.unset(CHECKPOINT_MANAGER)
    assert sink.loaded == 40
    assert sum(client.xlen(s) for s in shards) == 0
    states = db.run(conn, core.task_states(first + second))
    assert len(states) == 745
    assert conn.execute("SELECT count(*) FROM rota.tasks").fetchone() == (745,)


def _load(
    settings: Settings,
    query: str,
    batch_id: int,
    rows: list[tuple[str, str, str]],
    groups: int = 1,
) -> list[Any]:
    """Loads (stream, entry id, tasks' JSON) rows as the source's tasks do,
    a shard each, through an executor's loader: the groups' results."""
    from rota.loader.spark_load import LoadJob, ShardLoader

    loader = ShardLoader(LoadJob(settings, query))
    try:
        return [
            result
            for stream in sorted({r[0] for r in rows})
            for entries in [[(e, data) for s, e, data in rows if s == stream]]
            for result in loader.load(
                stream,
                batch_id,
                entries[-1][0],
                [(e, TaskBatch.from_checked_json(data), []) for e, data in entries],
                groups,
            )
        ]
    finally:
        loader.close()


def test_a_replayed_micro_batch_skips_the_shards_the_ledger_has_and_loads_the_rest(
    app: App, settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    from rota.loader.spark import BatchSink

    # Two tenants on two shards: two partitions, each its own transaction.
    a, b = _tenants_on_two_shards(settings)
    parse_pdf = app.tasks["parse_pdf"]
    ids = app.enqueue_many([parse_pdf.using(tenant=a).prepare(str(i)) for i in range(10)])
    ids += app.enqueue_many([parse_pdf.using(tenant=b).prepare(str(i)) for i in range(6)])
    rows = [(s, f"{n}-0", data) for n, (s, data) in enumerate(_entries(settings, ids), 1)]
    shard_a = stream_name(settings.stream_prefix, shard_for(a, settings.shards))
    sink = BatchSink(settings, query_key="q1")
    sink.settle_batch(_load(settings, "q1", 7, rows), 7)
    # The same batch again, as after a crash before Spark's commit: nothing read.
    again = _load(settings, "q1", 7, rows)
    assert [(r.fresh, r.tasks, r.first) for r in again] == [(False, 0, "")] * 2
    sink.settle_batch(again, 7)
    assert sink.loaded == 16
    # Batch 8 crashed after shard a's partition committed and before shard b's:
    # its replay loads b's tasks only (a's ids would dedupe them anyway, so
    # the counts tell: the ledger, not ON CONFLICT, skipped them).
    more = app.enqueue_many([parse_pdf.using(tenant=a).prepare(f"m{i}") for i in range(4)])
    more += app.enqueue_many([parse_pdf.using(tenant=b).prepare(f"m{i}") for i in range(3)])
    later = [(s, f"{n}-0", data) for n, (s, data) in enumerate(_entries(settings, more), 9)]
    _load(settings, "q1", 8, [r for r in later if r[0] == shard_a])
    replay = BatchSink(settings, query_key="q1")
    replay.settle_batch(_load(settings, "q1", 8, later), 8)
    _load(settings, "q2", 7, rows)  # another query: ids dedupe it anyway
    sink.close()
    replay.close()
    assert replay.loaded == 3
    assert conn.execute("SELECT count(*) FROM rota.tasks").fetchone() == (23,)
    ledger = conn.execute(
        "SELECT query, batch_id, part, tasks FROM rota.loader_batches ORDER BY 1, 2, 3"
    ).fetchall()
    part_a, part_b = shard_for(a, settings.shards), shard_for(b, settings.shards)
    assert ledger == sorted(
        [
            ("q1", 7, part_a, 10),
            ("q1", 7, part_b, 6),
            ("q1", 8, part_a, 4),
            ("q1", 8, part_b, 3),
            ("q2", 7, part_a, 0),
            ("q2", 7, part_b, 0),
        ]
    )


def test_a_shard_loads_in_chunks_as_its_entries_arrive_keeping_each_tenants_order(
    app: App, settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    ids = []
    for start in range(0, 40, 8):  # five entries per tenant, eight tasks each
        ids += app.enqueue_many(
            [
                parse_pdf.using(tenant=t).prepare(i)
                for t in ("a", "b")
                for i in range(start, start + 8)
            ]
        )
    rows = [(s, f"{n}-0", data) for n, (s, data) in enumerate(_entries(settings, ids), 1)]
    results = _load(settings.model_copy(update={"spark_load_size": 12}), "q", 0, rows)
    assert sum(r.stored for r in results) == 80
    assert conn.execute("SELECT sum(tasks) FROM rota.loader_batches").fetchone() == (80,)
    claimed = db.run(conn, core.claim(["pdfs"], 80, "w"))
    for tenant in ("a", "b"):
        assert [t.args[0] for t in claimed if t.tenant == tenant] == list(range(40))


@pytest.mark.parametrize("lost", ["before the batch", "mid-read"])
def test_a_shards_tenants_load_in_groups_and_a_replay_loads_the_groups_an_outage_stopped(
    app: App, settings: Settings, conn: psycopg.Connection[Any], lost: str
) -> None:
    from rota.loader.spark import BatchSink, ShardOutage
    from rota.loader.spark_load import LoadJob, ShardLoader

    # Loads of one entry: each entry goes to its group's connection as read.
    loader = ShardLoader(LoadJob(settings.model_copy(update={"spark_load_size": 1}), "q"))
    shard_0 = [t for t in (f"t{i}" for i in range(400)) if shard_for(t, settings.shards) == 0]
    tenants = shard_0[:8]
    group = {t: loader.group_of(t, 2) for t in tenants}
    assert set(group.values()) == {0, 1}
    parse_pdf = app.tasks["parse_pdf"]
    ids = []
    for start in range(0, 50, 10):  # entries mixing the tenants, ten tasks each a round
        ids += app.enqueue_many(
            [
                parse_pdf.using(tenant=t).prepare(i)
                for t in tenants
                for i in range(start, start + 10)
            ]
        )
    client = redis.Redis.from_url(settings.redis_url)
    stream = stream_name(settings.stream_prefix, 0)
    entries = [
        (e.decode(), TaskBatch.from_checked_json(f[b"tasks"].decode()), [])
        for e, f in client.xrange(stream)
    ]
    assert len(entries) == 5 and sum(len(b) for _, b, _ in entries) == 400
    last = entries[-1][0]

    def lose_group_1() -> None:
        pid = loader.conn(1).get().info.backend_pid
        conn.execute("SELECT pg_terminate_backend(%s)", [pid])
        gone = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
        wait_for(lambda: conn.execute(gone, [pid]).fetchone() == (0,), what="the backend gone")

    def read() -> Any:
        yield entries[0]
        if lost == "mid-read":  # group 1 loaded the first entry's tasks, uncommitted
            lose_group_1()
        yield from entries[1:]

    # Group 1's connection is lost: its group reports the outage, group 0 loads.
    if lost == "before the batch":
        lose_group_1()
    first = loader.load(stream, 4, last, read(), 2)
    assert [(r.part, r.fresh, r.outage is None) for r in first] == [
        (0, True, True),
        (1, False, False),
    ]
    sink = BatchSink(settings, query_key="q")
    with pytest.raises(ShardOutage):
        sink.settle_batch(first, 4)
    assert client.xlen(stream) == 5  # a group is missing: nothing trimmed
    stored = conn.execute("SELECT DISTINCT tenant FROM rota.tasks").fetchall()
    assert {t for (t,) in stored} == {t for t in tenants if group[t] == 0}
    # The batch again: the ledger has group 0, so group 1 loads alone.
    again = loader.load(stream, 4, last, entries, 2)
    assert [(r.part, r.fresh) for r in again] == [(0, False), (1, True)]
    sink.settle_batch(again, 4)
    loader.close()
    sink.close()
    assert client.xlen(stream) == 0
    assert sink.loaded == 400
    ledger = conn.execute(
        "SELECT part, tasks FROM rota.loader_batches WHERE query = 'q' ORDER BY part"
    ).fetchall()
    in_0 = sum(group[t] == 0 for t in tenants)
    assert ledger == [(0, 50 * in_0), (1, 50 * (8 - in_0))]
    claimed = db.run(conn, core.claim(["pdfs"], 400, "w"))
    assert sorted(map(str, (t.id for t in claimed))) == sorted(map(str, ids))
    for tenant in tenants:  # each in one transaction, in enqueue order
        assert [t.args[0] for t in claimed if t.tenant == tenant] == list(range(50))


def test_a_batch_is_planned_with_the_groups_its_offsets_name(app: App, settings: Settings) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from rota.loader.spark_load import LoadJob
    from rota.loader.spark_source import GROUPS, BufferStreamReader

    shards = all_streams(settings.stream_prefix, settings.shards)
    options = {"redis_url": settings.redis_url, "streams": ",".join(shards), "groups": "3"}
    reader = BufferStreamReader(options, LoadJob(settings, "q"))
    start = reader.initialOffset()
    assert start == {**dict.fromkeys(shards, "0-0"), GROUPS: "3"}
    # Nothing new: the same offsets, whatever the setting (no empty batch).
    old = {**dict.fromkeys(shards, "0-0"), GROUPS: "1"}
    assert reader.latestOffset(old, ReadAllAvailable()) == old
    parse_pdf = app.tasks["parse_pdf"]
    app.enqueue_many([parse_pdf.using(tenant=f"t{i}").prepare(i) for i in range(20)])
    end = reader.latestOffset(old, ReadAllAvailable())
    assert end[GROUPS] == "3"  # a new batch splits as the setting says now
    assert {p.value[3] for p in reader.partitions(old, end)} == {3}
    # A batch checkpointed before groups (no key) replays as one group.
    before = {k: v for k, v in end.items() if k != GROUPS}
    planned = reader.partitions(old, before)
    assert planned and {p.value[3] for p in planned} == {1}
    reader.commit(end)  # the groups' key is not a stream to trim
    client = redis.Redis.from_url(settings.redis_url)
    assert sum(client.xlen(s) for s in shards) == 0
    assert not client.exists(GROUPS)
    reader.stop()


def test_a_trigger_that_finds_the_buffer_empty_waits_for_an_entry_and_wakes_on_one(
    app: App, settings: Settings
) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from rota.loader.spark_load import LoadJob
    from rota.loader.spark_source import BufferStreamReader

    shards = all_streams(settings.stream_prefix, settings.shards)
    options = {"redis_url": settings.redis_url, "streams": ",".join(shards)}
    start = BufferStreamReader(options, LoadJob(settings, "q")).initialOffset()
    # Without a wait, an empty buffer answers the same offsets at once.
    assert (
        BufferStreamReader(options, LoadJob(settings, "q")).latestOffset(start, ReadAllAvailable())
        == start
    )
    # With one, the trigger waits; an entry enqueued meanwhile ends the wait
    # (long before its 60 s) and is in the offsets it answers.
    waiting = BufferStreamReader(options | {"idle_wait": "60"}, LoadJob(settings, "q"))
    answered: list[dict[str, str]] = []
    asking = threading.Thread(
        target=lambda: answered.append(waiting.latestOffset(start, ReadAllAvailable()))
    )
    asking.start()
    client = redis.Redis.from_url(settings.redis_url)
    wait_for(lambda: any(c.get("cmd") == "xread" for c in client.client_list()), what="the XREAD")
    assert not answered
    app.enqueue_many([app.tasks["parse_pdf"].using(tenant="t").prepare(1)])
    asking.join(30)
    assert not asking.is_alive()
    (end,) = answered
    [(stream, entries)] = client.xread({s: "0-0" for s in shards})
    assert end == {**start, stream.decode(): entries[-1][0].decode()}
    waiting.stop()
    # A wait longer than the Redis timeout that sees no entry ends without an
    # error, with the same offsets.
    options |= {"redis_timeout": "0.2", "idle_wait": "0.5"}
    quiet = BufferStreamReader(options, LoadJob(settings, "q"))
    assert quiet.latestOffset(end, ReadAllAvailable()) == end
    quiet.stop()


def test_tasks_postgresql_refuses_are_dead_lettered_and_the_rest_loaded(
    settings: Settings, conn: psycopg.Connection[Any]
) -> None:
    batch = TaskBatch(datetime.now(UTC))
    for i in range(3):
        batch.add(envelope_template("x.y", "q"), f"t{i}")
    # Over the cost bound the database checks (the executors' checks catch it;
    # this entry skips them).
    batch.costs[1] = 1e7
    data = batch.to_json().decode()
    stream = stream_name(settings.stream_prefix, 0)
    (result,) = _load(settings, "q", 0, [(stream, "5-0", data)])
    assert (result.stored, result.dead) == (2, 1)
    dead = redis.Redis.from_url(settings.redis_url).xrange(
        dead_letter_stream(settings.stream_prefix)
    )
    assert len(dead) == 1 and b"refused by PostgreSQL" in dead[0][1][b"reason"]
    assert (dead[0][1][b"stream"], dead[0][1][b"entry"]) == (stream.encode(), b"5-0")
    assert conn.execute("SELECT count(*) FROM rota.tasks").fetchone() == (2,)


def _tenants_on_two_shards(settings: Settings) -> tuple[str, str]:
    first = "a"
    for n in range(100):
        other = f"b{n}"
        if shard_for(other, settings.shards) != shard_for(first, settings.shards):
            return first, other
    raise AssertionError("no two tenants on different shards")


def _entries(settings: Settings, ids: list[Any]) -> list[tuple[str, str]]:
    """Each buffer entry's tasks as the source's rows carry them (a batch's JSON)."""
    client = redis.Redis.from_url(settings.redis_url)
    found = []
    for stream in all_streams(settings.stream_prefix, settings.shards):
        for _, fields in client.xrange(stream):
            data = fields[b"tasks"].decode()
            if set(json.loads(data)["id"]) & {str(i) for i in ids}:
                found.append((stream, data))
    assert sum(len(json.loads(data)["id"]) for _, data in found) == len(ids)
    return found


def test_rota_import_loads_good_rows_and_reports_bad_ones(
    spark: Any, settings: Settings, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    from rota.loader.importer import import_tasks

    csv = tmp_path / "tasks.csv"
    csv.write_text(
        "name,tenant,queue,args,kwargs,cost\n"
        'app.parse,alice,pdfs,"[1, 2]","{""x"": 1}",1\n'
        'app.parse,bob,pdfs,"[3]",,2\n'
        'app.parse,bad tenant,pdfs,"[4]",,1\n'
        'not a name!,alice,pdfs,"[5]",,1\n'
        'app.parse,carol,pdfs,"[not json",,1\n'
        'app.parse,dave,pdfs,"[6]",,-3\n'
    )
    summary = import_tasks(settings, f"file://{csv}", session=spark)  # a URI: rejects beside it
    assert (summary.rows, summary.loaded, summary.rejected) == (6, 2, 4)
    assert summary.rejected_path is not None
    reasons = [line["reason"] for line in _rejected_lines(summary.rejected_path)]
    assert len(reasons) == 4 and len(summary.examples) == 4
    assert any("tenant" in r for r in reasons) and any("task name" in r for r in reasons)
    assert any("JSON" in r or "Expecting" in r for r in reasons) and any(
        "cost" in r for r in reasons
    )
    got = db.run(conn, core.claim(["pdfs"], 10, "w"))
    assert {(t.tenant, tuple(t.args)) for t in got} == {("alice", (1, 2)), ("bob", (3,))}

    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text(
        "\n".join(
            json.dumps(
                {"name": "app.parse", "tenant": f"t{i}", "args": [i], "idempotency_key": f"k{i}"}
            )
            for i in range(50)
        )
    )
    assert import_tasks(settings, str(jsonl), session=spark).loaded == 50
    again = import_tasks(settings, str(jsonl), session=spark)
    assert (again.loaded, again.duplicates) == (0, 50)  # idempotency keys: no second copy


def _rejected_lines(uri: str) -> list[dict[str, Any]]:
    """The JSON lines Spark wrote under `uri` (a directory of part files)."""
    folder = Path(uri.removeprefix("file://"))
    return [json.loads(line) for part in sorted(folder.glob("part-*")) for line in part.open()]


def test_importing_a_file_again_or_retrying_it_loads_nothing_new(
    spark: Any, settings: Settings, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    from rota.loader.importer import import_tasks

    csv = tmp_path / "unkeyed.csv"
    # Two identical rows are two tasks; no row has an idempotency key.
    csv.write_text("name,tenant,args\n" + 'app.parse,alice,"[1]"\n' * 2 + 'app.parse,bob,"[2]"\n')
    first = import_tasks(settings, str(csv), session=spark)
    assert (first.rows, first.loaded, first.duplicates) == (3, 3, 0)
    # A failed import left part of the file loaded: the retry loads the rest.
    conn.execute(
        "DELETE FROM rota.ready WHERE task_id = (SELECT id FROM rota.tasks WHERE tenant = 'bob')"
    )
    conn.execute("DELETE FROM rota.tasks WHERE tenant = 'bob'")
    retry = import_tasks(settings, str(csv), session=spark)
    assert (retry.loaded, retry.duplicates) == (1, 2)
    again = import_tasks(settings, str(csv), session=spark)
    assert (again.loaded, again.duplicates) == (0, 3)
    assert conn.execute("SELECT count(*) FROM rota.tasks").fetchone() == (3,)


def test_parquet_timestamps_are_instants_and_bad_bounds_are_refused_not_replaced(
    spark: Any, settings: Settings, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    from pyspark.sql.types import (
        IntegerType,
        StringType,
        StructField,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    from rota.loader.importer import import_tasks

    at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    schema = StructType(
        [
            StructField("name", StringType()),
            StructField("tenant", StringType()),
            StructField("eta", TimestampType()),
            StructField("max_attempts", IntegerType()),
        ]
    )
    rows = [("app.parse", "alice", at, 5), ("app.parse", "bob", at, 0)]
    path = str(tmp_path / "tasks.parquet")
    spark.createDataFrame(rows, schema).write.parquet(path)
    rejected = f"file://{tmp_path}/refused"
    summary = import_tasks(settings, path, rejected_path=rejected, session=spark)
    assert (summary.loaded, summary.rejected) == (1, 1)
    [line] = _rejected_lines(rejected)
    assert "max_attempts" in line["reason"] and line["row"]["tenant"] == "bob"
    stored = conn.execute("SELECT tenant, eta, max_attempts FROM rota.tasks").fetchall()
    assert stored == [("alice", at, 5)]

    ntz = StructType([*schema.fields[:2], StructField("eta", TimestampNTZType())])
    local = str(tmp_path / "ntz.parquet")
    spark.createDataFrame([("app.parse", "carol", at.replace(tzinfo=None))], ntz).write.parquet(
        local
    )
    assert import_tasks(settings, local, session=spark).loaded == 1
    row = conn.execute("SELECT eta FROM rota.tasks WHERE tenant = 'carol'").fetchone()
    assert row == (at,)  # a zone-less timestamp is read as UTC


@pytest.mark.slow(reason="two `rota import` runs, each starting its own JVM")
def test_rota_import_keeps_sparks_own_output_out_of_the_terminal_and_fails_in_one_line(
    settings: Settings, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    csv = tmp_path / "one.csv"
    csv.write_text('name,tenant,args\napp.parse,alice,"[1]"\n')
    env = {**os.environ, "ROTA_DATABASE_URL": settings.database_url}
    env.pop("SPARK_CONF_DIR", None)
    command = [sys.executable, "-m", "rota", "import", str(csv)]
    done = subprocess.run(
        [*command, "--conf", "spark.sql.shuffle.partitions=2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["loaded"] == 1
    for noise in ("WARN", "log4j", "WARNING", "setLogLevel"):
        assert noise not in done.stderr, done.stderr

    failed = subprocess.run(
        [*command, "--conf", "spark.sql.files.maxPartitionBytes=lots"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 2
    [line] = failed.stderr.strip().splitlines()
    assert line.startswith("rota: Spark failed:") and "spark.sql.files.maxPartitionBytes" in line

    refused = subprocess.run(
        [*command, "--conf", "no-equals-sign"], env=env, capture_output=True, text=True
    )
    assert refused.returncode == 2 and "key=value" in refused.stderr
