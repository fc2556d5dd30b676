"""Loads of one queue in parallel: a load locks its tenants' tags, never the
queue, so loads of other tenants commit while it is open, and loads of the
same tenant take turns (each reading the tag the other settled)."""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from typing import Any

import psycopg
import pytest

from rota import App, Settings
from tests.helpers import envelopes, load, wait_for, waiting_on_a_lock

Conn = psycopg.Connection[Any]
# A load that waits for a lock it should not need fails within this, rather
# than hanging the test.
NO_WAIT = "SET lock_timeout = '5s'"


def _queues(database_url: str, *names: str) -> None:
    """Creates the queues: a queue's first load creates its row, and a load
    into a queue whose creation is not committed yet waits for it (once)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        for name in names:
            conn.execute("INSERT INTO rota.queues (name) VALUES (%s)", [name])


def _ready(conn: Conn, queue: str = "default") -> dict[str, list[float]]:
    """Each tenant's places in line (start tags), in arrival order."""
    rows = conn.execute(
        "SELECT t.name, r.vtime FROM rota.ready r JOIN rota.tenants t ON t.id = r.tenant_id"
        " JOIN rota.queues q ON q.id = r.queue_id WHERE q.name = %s ORDER BY r.seq",
        [queue],
    ).fetchall()
    places: dict[str, list[float]] = defaultdict(list)
    for tenant, vtime in rows:
        places[tenant].append(vtime)
    return dict(places)


@pytest.mark.parametrize("size", [5, 500], ids=["insert", "copy"])
def test_a_load_of_another_tenant_commits_while_one_is_open(database_url: str, size: int) -> None:
    _queues(database_url, "default")
    with psycopg.connect(database_url) as holder, psycopg.connect(database_url) as other:
        other.execute(NO_WAIT)
        other.commit()
        holder.execute("SELECT 1")  # a transaction open: the load stays in it
        load(holder, envelopes("a", size))
        assert load(other, envelopes("b", size)) == size  # committed, not waited
        with psycopg.connect(database_url, autocommit=True) as check:
            assert set(_ready(check)) == {"b"}
        holder.commit()
        with psycopg.connect(database_url, autocommit=True) as check:
            places = _ready(check)
    # Both started from the same clock: they take turns, one task each a round.
    assert places["a"] == places["b"] == [float(i) for i in range(size)]


def test_loads_of_one_tenant_take_turns_each_reading_the_settled_tag(database_url: str) -> None:
    with psycopg.connect(database_url) as holder, psycopg.connect(database_url) as other:
        holder.execute("SELECT 1")
        load(holder, envelopes("a", 100))
        done = threading.Event()

        def second() -> None:
            load(other, envelopes("a", 100))
            done.set()

        thread = threading.Thread(target=second)
        thread.start()
        with psycopg.connect(database_url, autocommit=True) as check:
            wait_for(lambda: waiting_on_a_lock(check, other.info.backend_pid), what="a lock wait")
        assert not done.is_set()
        holder.commit()
        thread.join(30)
        assert done.is_set()
        with psycopg.connect(database_url, autocommit=True) as check:
            places = _ready(check)
    # The second load started where the first left the tenant's tag.
    assert places["a"] == [float(i) for i in range(200)]


def test_a_transactional_enqueue_does_not_hold_up_another_tenants(
    app: App, database_url: str
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    _queues(database_url, "pdfs")
    with psycopg.connect(database_url) as holder, psycopg.connect(database_url) as other:
        other.execute(NO_WAIT)
        other.commit()
        parse_pdf.using(tenant="alice", connection=holder).enqueue("a.pdf")
        parse_pdf.using(tenant="bob", connection=other).enqueue("b.pdf")
        other.commit()
        with psycopg.connect(database_url, autocommit=True) as check:
            assert set(_ready(check, "pdfs")) == {"bob"}
        holder.commit()
        with psycopg.connect(database_url, autocommit=True) as check:
            assert _ready(check, "pdfs") == {"alice": [0.0], "bob": [0.0]}


def test_the_producer_fallback_does_not_wait_for_another_tenants_load(database_url: str) -> None:
    # Redis unreachable: the enqueue goes straight into PostgreSQL.
    down = Settings(database_url=database_url, redis_url="redis://127.0.0.1:1/0", redis_retries=0)
    fallback = App(down)
    stored: list[Any] = []
    _queues(database_url, "q")
    try:
        with psycopg.connect(database_url) as holder:
            holder.execute("SELECT 1")
            load(holder, envelopes("a", 500, queue="q"))
            thread = threading.Thread(
                target=lambda: stored.append(fallback.enqueue("x.y", queue="q", tenant="b"))
            )
            thread.start()
            thread.join(20)
            assert stored, "the fallback waited for the open load"
            assert fallback._core.fallbacks == 1
            with psycopg.connect(database_url, autocommit=True) as check:
                assert _ready(check, "q") == {"b": [0.0]}
            holder.commit()
    finally:
        fallback.close()


def test_loads_with_overlapping_tenants_in_both_orders_never_deadlock(database_url: str) -> None:
    """Eight connections load batches of the same tenants, each batch in its
    own order (reversed, shuffled, spread over two queues): none deadlocks or
    fails, and each tenant's places in line are exactly those of loads that
    took turns on its tag (no place given twice, none skipped)."""
    tenants = [f"t{i}" for i in range(12)]
    loaders, rounds, per_tenant = 8, 15, 7
    errors: list[BaseException] = []
    start = threading.Barrier(loaders)

    def loader(number: int) -> None:
        rng = random.Random(number)
        try:
            with psycopg.connect(database_url, autocommit=True) as conn:
                start.wait()
                for _ in range(rounds):
                    order = tenants[::-1] if number % 2 else list(tenants)
                    if number % 3 == 0:
                        rng.shuffle(order)
                    batch = [
                        e
                        for tenant in order
                        for queue in ("default", "other")
                        for e in envelopes(tenant, per_tenant, queue=queue)
                    ]
                    # Small loads (one INSERT) and COPYs both.
                    size = rng.choice([len(batch), 60])
                    for i in range(0, len(batch), size):
                        load(conn, batch[i : i + size])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=loader, args=(n,)) for n in range(loaders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    total = loaders * rounds * per_tenant
    with psycopg.connect(database_url, autocommit=True) as conn:
        for queue in ("default", "other"):
            places = _ready(conn, queue)
            assert set(places) == set(tenants)
            for tenant in tenants:
                # Every load of a tenant started where the one before ended:
                # its tasks hold the places 0, 1, 2, ..., each once.
                assert sorted(places[tenant]) == [float(i) for i in range(total)], tenant
