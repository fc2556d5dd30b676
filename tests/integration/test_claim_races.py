"""Claims raced by 8 connections at once: no task twice, limits hold."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import psycopg

from rota import core
from rota.core import db
from tests.helpers import envelopes, load

CLAIMERS = 8


def _race(database_url: str, work: Any) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(CLAIMERS)

    def claimer(number: int) -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as conn:
                start.wait()
                work(conn, number)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(CLAIMERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def _claim_everything(database_url: str) -> list[Any]:
    """Races CLAIMERS claimers, each claiming and completing until nothing is
    left; the ids claimed (asserting that no claimer failed)."""
    claimed: list[Any] = []
    lock = threading.Lock()

    def work(conn: psycopg.Connection[Any], number: int) -> None:
        while True:
            got = db.transact(conn, core.claim(["default"], 25, f"w{number}"))
            if not got:
                return
            with lock:
                claimed.extend(t.id for t in got)
            db.transact(conn, core.complete(t.token for t in got))

    assert _race(database_url, work) == []
    return claimed


def test_eight_racing_claimers_never_claim_a_task_twice(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        load(conn, [e for t in range(20) for e in envelopes(f"t{t}", 200)])
    claimed = _claim_everything(database_url)
    assert len(claimed) == 4000
    assert len(set(claimed)) == 4000


def test_racing_claims_that_swap_urgent_tasks_never_claim_a_task_twice(
    database_url: str,
) -> None:
    """Priorities make claims move a tenant's displaced tasks to new places
    while others claim: each task still runs once, and no claim fails."""
    priorities = [0, 0, 0, 5, 9]
    with psycopg.connect(database_url, autocommit=True) as conn:
        load(
            conn,
            [
                e
                for t in range(20)
                for n in range(len(priorities))
                for e in envelopes(f"t{t}", 40, priority=priorities[(t + n) % 5])
            ],
        )
    claimed = _claim_everything(database_url)
    assert len(claimed) == 4000
    assert len(set(claimed)) == 4000


def test_concurrency_limits_hold_under_racing_claims(database_url: str) -> None:
    limits = {"a": 1, "b": 2, "c": 3}
    with psycopg.connect(database_url, autocommit=True) as conn:
        for tenant, limit in limits.items():
            db.transact(conn, core.configure_tenant(tenant, concurrency_limit=limit))
        load(conn, [e for t in [*limits, "free"] for e in envelopes(t, 150)])
    done = threading.Event()
    worst: Counter[str] = Counter()
    samples = 0

    def watch() -> None:
        nonlocal samples
        with psycopg.connect(database_url, autocommit=True) as conn:
            while not done.is_set():
                rows = conn.execute(
                    "SELECT tn.name, count(*) FROM rota.running r "
                    "JOIN rota.tenants tn ON tn.id = r.tenant_id GROUP BY tn.name"
                ).fetchall()
                for tenant, running in rows:
                    worst[tenant] = max(worst[tenant], running)
                samples += 1

    def work(conn: psycopg.Connection[Any], number: int) -> None:
        rng = random.Random(number)
        idle = 0
        while idle < 20:
            got = db.transact(conn, core.claim(["default"], 10, f"w{number}"))
            if not got:
                idle += 1
                time.sleep(0.005)
                continue
            idle = 0
            time.sleep(rng.uniform(0, 0.004))  # "run" the tasks
            assert db.transact(conn, core.complete(t.token for t in got)) == {t.id for t in got}

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert _race(database_url, work) == []
    finally:
        done.set()
        watcher.join()
    assert samples > 10
    for tenant, limit in limits.items():
        assert 1 <= worst[tenant] <= limit, (tenant, worst[tenant])
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert db.run(conn, core.queue_counts())["default"] == {
            "ready": 0,
            "running": 0,
            "scheduled": 0,
        }
        counters = dict(conn.execute("SELECT name, running FROM rota.tenants").fetchall())
        assert counters == {"a": 0, "b": 0, "c": 0, "free": 0}
        assert conn.execute("SELECT count(*) FROM rota.finished").fetchone() == (600,)
        assert conn.execute("SELECT count(*) FROM rota.tasks").fetchone() == (0,)


def test_loaders_racing_with_the_same_tasks_store_each_once(database_url: str) -> None:
    """A replayed batch loaded while its first load is still open: the second
    COPY waits on the first, meets its ids and loads only what is new."""
    shared = envelopes("alice", 200)
    loaded: list[int] = []

    def loader(conn: psycopg.Connection[Any], number: int) -> None:
        own = envelopes(f"t{number}", 10)
        with conn.transaction():
            loaded.append(db.run(conn, core.load(shared + own)))
            time.sleep(random.random() / 10)  # keep the others waiting on these ids

    assert _race(database_url, loader) == []
    assert sorted(loaded, reverse=True)[0] == 210
    assert sum(loaded) == 200 + 10 * CLAIMERS
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert db.run(conn, core.queue_counts())["default"]["ready"] == 200 + 10 * CLAIMERS
