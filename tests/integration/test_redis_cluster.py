"""The buffer on a real Redis Cluster (three masters on loopback, from the
machine's redis-server): rota finds out by itself that ROTA_REDIS_URL names a
cluster node, every shard's commands go to the node that owns its slot, and
a slot moving or a master failing loses no acknowledged task."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

import psycopg
import pytest
import redis
import redis.cluster

from rota import App, Settings, core
from rota.buffer import redis_client
from rota.buffer.streams import ENTRY_VERSION, all_streams, dead_letter_stream, stream_name
from rota.core import db
from rota.loader import Loader
from rota_tools.devservers import RedisCluster, local_redis_cluster, wait_for_cluster
from tests.helpers import wait_for

Conn = psycopg.Connection[Any]
TENANTS = 1000
SHARDS = 12


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with local_redis_cluster(masters=3) as started:
        yield started


def _flush(cluster: RedisCluster) -> None:
    for node in cluster.nodes:
        if node.process.poll() is None:
            with redis.Redis(port=node.port) as client:
                if client.info("replication")["role"] == "master":
                    client.flushall()


@pytest.fixture
def cluster_settings(cluster: RedisCluster, database_url: str) -> Iterator[Settings]:
    _flush(cluster)
    yield _settings(cluster, database_url)


def _settings(cluster: RedisCluster, database_url: str, **extra: Any) -> Settings:
    return Settings(
        database_url=database_url,
        # Any node will do; the second one, so that it is not the first master.
        redis_url=cluster.nodes[1].url,
        shards=SHARDS,
        redis_timeout=1.0,
        breaker_reset_seconds=0.5,
        loader_idle_reclaim_seconds=1.0,
        **extra,
    )


def _app(settings: Settings) -> App:
    app = App(settings)

    @app.task(queue="pdfs")
    def parse_pdf(owner: str, number: int) -> None:
        pass

    return app


def _stored_in_order(conn: Conn) -> dict[str, list[int]]:
    """Per tenant, the numbers its tasks were enqueued with, in their places in line."""
    rows = conn.execute("SELECT tenant, payload::text FROM rota.tasks ORDER BY seq").fetchall()
    numbers: dict[str, list[int]] = {}
    for tenant, payload in rows:
        numbers.setdefault(tenant, []).append(json.loads(payload)["args"][1])
    return numbers


def _owner(client: redis.cluster.RedisCluster, key: str) -> str:
    return str(client.get_node_from_key(key).name)  # type: ignore[no-untyped-call]


def test_a_cluster_is_found_by_itself_and_each_shard_lives_on_its_slots_owner(
    cluster_settings: Settings,
) -> None:
    client = redis_client.connect(cluster_settings)
    assert isinstance(client, redis.cluster.RedisCluster)
    streams = all_streams(cluster_settings.stream_prefix, cluster_settings.shards)
    # The shards spread over the masters, each with its backlog hash in its slot.
    assert len({_owner(client, s) for s in streams}) == 3
    assert all(_owner(client, s) == _owner(client, f"{s}:backlog") for s in streams)
    client.close()


def test_enqueues_across_a_thousand_tenants_load_exactly_once_in_each_tenants_order(
    cluster_settings: Settings, conn: Conn
) -> None:
    app = _app(cluster_settings)
    parse_pdf = app.tasks["parse_pdf"]
    ids: list[UUID] = []
    per_tenant = 6
    for number in range(per_tenant):
        calls = [parse_pdf.using(tenant=f"t{t}").prepare(f"t{t}", number) for t in range(TENANTS)]
        ids += app.enqueue_many(calls)
    ids += [parse_pdf.using(tenant="t7").enqueue("t7", per_tenant + n) for n in range(20)]
    app.close()
    assert app.producer.core.fallbacks == 0  # all went to the buffer

    loaders = [Loader(cluster_settings, consumer=f"loader-{i}") for i in range(2)]
    with ThreadPoolExecutor(2) as pool:
        drains = [pool.submit(loader.drain) for loader in loaders]
        summaries = [drain.result() for drain in drains]  # re-raises a loader's error
    # The first to finish may see the other's entries still in its hands
    # (work left); the last finds none.
    assert not any(s.errors for s in summaries)
    assert any(s.drained for s in summaries)
    for loader in loaders:
        loader.close()

    stored = conn.execute("SELECT count(*), count(DISTINCT id) FROM rota.tasks").fetchone()
    assert stored == (len(ids), len(ids))
    assert set(db.run(conn, core.task_states(ids))) == set(ids)
    in_line = _stored_in_order(conn)
    assert len(in_line) == TENANTS
    assert all(numbers == sorted(numbers) for numbers in in_line.values())
    assert in_line["t7"] == list(range(per_tenant + 20))
    client = redis_client.connect(cluster_settings)
    streams = all_streams(cluster_settings.stream_prefix, cluster_settings.shards)
    assert sum(int(client.xlen(s)) for s in streams) == 0  # acknowledged and deleted
    client.close()


def test_a_loader_waiting_on_an_empty_cluster_loads_a_task_as_soon_as_it_comes(
    cluster_settings: Settings, conn: Conn
) -> None:
    loader = Loader(cluster_settings)
    loader.ensure_groups()
    app = _app(cluster_settings)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(loader.pass_once, block_ms=5000)
        app.tasks["parse_pdf"].using(tenant="late").enqueue("late", 1)
        assert waiting.result().loaded == 1
    loader.close()
    app.close()


def test_stats_dead_letters_and_the_async_producer_work_on_a_cluster(
    cluster_settings: Settings, conn: Conn
) -> None:
    import asyncio

    client = redis_client.connect(cluster_settings)
    shard = stream_name(cluster_settings.stream_prefix, 5)
    client.xadd(shard, {b"v": ENTRY_VERSION, b"tasks": b"{not json"})

    async def produce() -> list[UUID]:
        app = _app(cluster_settings)
        task = app.tasks["parse_pdf"]
        ids = [await task.using(tenant=f"a{i}").aenqueue(f"a{i}", i) for i in range(30)]
        await app.aclose()
        return ids

    ids = asyncio.run(produce())
    env = {
        "ROTA_DATABASE_URL": cluster_settings.database_url,
        "ROTA_REDIS_URL": cluster_settings.redis_url,
        "ROTA_SHARDS": str(SHARDS),
        "PATH": "/usr/bin:/bin",
    }
    stats = _rota(env, "stats", "--json")
    assert len(stats["buffer"]) == SHARDS and "redis" not in stats["unavailable"]
    assert sum(shard["entries"] for shard in stats["buffer"].values()) == 31
    loader = Loader(cluster_settings)
    summary = loader.drain()
    loader.close()
    assert (summary.loaded, summary.dead_lettered) == (30, 1)
    assert set(db.run(conn, core.task_states(ids))) == set(ids)
    # The console reads the same through its own client.
    from rota.dashboard import data

    console = data.Connections(cluster_settings)
    try:
        overview = data.overview(console)
        assert "redis" not in overview["unavailable"] and len(overview["buffer"]) == SHARDS
        assert data.dead_letters(console, None)["total"] == 1
    finally:
        console.close()
    letters = _rota(env, "dead-letters", "list", "--json")
    assert letters["total"] == 1 and "not JSON" in letters["letters"][0]["reason"]
    purged = _rota(env, "dead-letters", "purge", "--all", "--json")
    assert purged == {"purged": 1}
    assert int(client.xlen(dead_letter_stream(cluster_settings.stream_prefix))) == 0
    client.close()


def _rota(env: dict[str, str], *args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "rota", *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_shard_whose_slot_moves_while_producing_loses_nothing(
    cluster: RedisCluster, cluster_settings: Settings, conn: Conn
) -> None:
    app = _app(cluster_settings)
    parse_pdf = app.tasks["parse_pdf"]
    shard = stream_name(cluster_settings.stream_prefix, 0)
    tenants = [t for t in (f"m{i}" for i in range(200)) if _shard_of(t) == 0][:5]
    acknowledged: list[UUID] = []
    stop = threading.Event()

    def produce() -> None:
        number = 0
        while not stop.is_set() or number < 400:
            tenant = tenants[number % len(tenants)]
            acknowledged.append(parse_pdf.using(tenant=tenant).enqueue(tenant, number))
            number += 1

    with ThreadPoolExecutor(1) as pool:
        producing = pool.submit(produce)
        wait_for(lambda: len(acknowledged) > 100, what="tasks enqueued before the move")
        moved_to = _move_slot(cluster, shard)
        stop.set()
        producing.result()
    app.close()

    client = redis_client.connect(cluster_settings)
    assert isinstance(client, redis.cluster.RedisCluster)
    assert _owner(client, shard) == moved_to
    assert app.producer.core.fallbacks == 0  # redirected, never refused
    loader = Loader(cluster_settings)
    loader.drain()
    loader.close()
    client.close()
    stored = conn.execute("SELECT count(*), count(DISTINCT id) FROM rota.tasks").fetchone()
    assert stored == (len(acknowledged), len(acknowledged))
    assert all(n == sorted(n) for n in _stored_in_order(conn).values())


def _shard_of(tenant: str) -> int:
    from rota.buffer.streams import shard_for

    return shard_for(tenant, SHARDS)


def _move_slot(cluster: RedisCluster, key: str) -> str:
    """Moves `key`'s slot to another master as `redis-cli --cluster reshard`
    does (IMPORTING, MIGRATING, MIGRATE the keys, then NODE on every master),
    with writes going on meanwhile; returns the new owner's name."""
    masters = [redis.Redis(port=n.port) for n in cluster.nodes if n.process.poll() is None]
    slot = int(masters[0].cluster("keyslot", key))
    ids = {m: m.cluster("myid").decode() for m in masters}  # type: ignore[union-attr]
    source = next(m for m in masters if slot in _slots(m))
    target = next(m for m in masters if m is not source)
    target.cluster("setslot", slot, "importing", ids[source])  # type: ignore[no-untyped-call]
    source.cluster("setslot", slot, "migrating", ids[target])  # type: ignore[no-untyped-call]
    port = target.connection_pool.connection_kwargs["port"]
    while keys := source.cluster("getkeysinslot", slot, 100):  # type: ignore[no-untyped-call]
        source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys)
    for master in (target, source, *masters):
        master.cluster("setslot", slot, "node", ids[target])  # type: ignore[no-untyped-call]
    for master in masters:
        master.close()
    return f"127.0.0.1:{port}"


def _slots(master: redis.Redis) -> set[int]:
    myid = master.cluster("myid").decode()  # type: ignore[union-attr]
    owned: set[int] = set()
    for start, end, *nodes in master.execute_command("CLUSTER SLOTS"):
        if nodes[0][2].decode() == myid:
            owned.update(range(start, end + 1))
    return owned


@pytest.fixture
def replicated() -> Iterator[RedisCluster]:
    with local_redis_cluster(masters=3, replicas=1) as started:
        yield started


def test_a_master_killed_while_producing_costs_no_acknowledged_task(
    replicated: RedisCluster, database_url: str, conn: Conn
) -> None:
    cluster = replicated
    shard = stream_name("rota:buffer", 0)
    with redis.cluster.RedisCluster.from_url(cluster.url) as probe:
        victim_name = _owner(probe, shard)
    victim = next(n for n in cluster.nodes if f"127.0.0.1:{n.port}" == victim_name)
    # The URL names a node that lives on; acknowledgements wait for a replica.
    survivor = next(n for n in cluster.nodes if n is not victim)
    settings = _settings(cluster, database_url, redis_wait_replicas=1).model_copy(
        update={"redis_url": survivor.url}
    )
    app = _app(settings)
    parse_pdf = app.tasks["parse_pdf"]
    acknowledged: list[UUID] = []
    stop = threading.Event()

    def produce() -> None:
        number = 0
        while not stop.is_set():
            tenant = f"k{number % 50}"
            acknowledged.append(parse_pdf.using(tenant=tenant).enqueue(tenant, number))
            number += 1

    with ThreadPoolExecutor(1) as pool:
        producing = pool.submit(produce)
        wait_for(lambda: len(acknowledged) > 300, what="tasks enqueued before the kill")
        victim.kill()
        killed_at = len(acknowledged)
        wait_for_cluster(cluster)  # a replica took the slots over
        wait_for(lambda: _owner_now(settings, shard) != victim_name, what="the new master")
        wait_for(lambda: len(acknowledged) > killed_at + 300, what="tasks enqueued after")
        stop.set()
        producing.result()  # no enqueue failed: each went to the buffer or PostgreSQL
    app.close()

    loader = Loader(settings)
    loader.drain()
    loader.close()
    stored = db.run(conn, core.task_states(acknowledged))
    assert set(stored) == set(acknowledged)
    counts = conn.execute("SELECT count(*), count(DISTINCT id) FROM rota.tasks").fetchone()
    assert counts == (len(acknowledged), len(acknowledged))


def _owner_now(settings: Settings, key: str) -> str:
    with redis.cluster.RedisCluster.from_url(settings.redis_url) as fresh:
        return _owner(fresh, key)


@pytest.mark.spark
def test_the_spark_loader_loads_a_clusters_shards_exactly_once_in_order(
    cluster_settings: Settings, conn: Conn, tmp_path: Any, spark: Any
) -> None:
    from rota.loader.spark import run_streaming

    app = _app(cluster_settings)
    parse_pdf = app.tasks["parse_pdf"]
    ids: list[UUID] = []
    for number in range(3):
        ids += app.enqueue_many(
            [parse_pdf.using(tenant=f"s{t}").prepare(f"s{t}", number) for t in range(TENANTS)]
        )
    app.close()
    checkpoint = str(tmp_path / "checkpoint")
    sink = run_streaming(cluster_settings, checkpoint=checkpoint, available_now=True, session=spark)
    assert sink.loaded == len(ids)
    again = run_streaming(
        cluster_settings, checkpoint=checkpoint, available_now=True, session=spark
    )
    assert again.loaded == 0  # restarted from its checkpoint: nothing twice
    counts = conn.execute("SELECT count(*), count(DISTINCT id) FROM rota.tasks").fetchone()
    assert counts == (len(ids), len(ids))
    in_line = _stored_in_order(conn)
    assert len(in_line) == TENANTS
    assert all(numbers == [0, 1, 2] for numbers in in_line.values())
    client = redis_client.connect(cluster_settings)
    streams = all_streams(cluster_settings.stream_prefix, cluster_settings.shards)
    assert sum(int(client.xlen(s)) for s in streams) == 0  # trimmed once loaded
    client.close()
