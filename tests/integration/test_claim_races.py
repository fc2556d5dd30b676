"""Claims raced by 8 connections at once: no task twice, limits hold."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from rota import Limit, core
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


def _claim_and_run(together: bool, keep_going: Callable[[], bool] = lambda: False) -> Any:
    """A claimer's work: claim, "run", complete (with the next claim when
    `together`, as workers do), until 20 claims in a row find nothing and
    `keep_going()` is false."""

    def work(conn: psycopg.Connection[Any], number: int) -> None:
        rng = random.Random(number)
        idle = 0
        ran: list[core.ClaimedTask] = []
        while idle < 20 or keep_going():
            if together:
                tokens = [t.token for t in ran]
                settled = db.run(
                    conn, core.complete_and_claim(tokens, ["default"], 10, f"w{number}")
                )
                assert settled.completed == len(ran)
                got = settled.claimed
                if got is None:  # a completion uncounted a limited tenant or key
                    got = db.transact(conn, core.claim(["default"], 10, f"w{number}"))
            else:
                if ran:
                    completed = db.transact(conn, core.complete(t.token for t in ran))
                    assert completed == {t.id for t in ran}
                got = db.transact(conn, core.claim(["default"], 10, f"w{number}"))
            ran = []
            if not got:
                idle += 1
                time.sleep(0.005)
                continue
            idle = 0
            time.sleep(rng.uniform(0, 0.004))  # "run" the tasks
            ran = got

    return work


def _watch(
    database_url: str, sql: str, done: threading.Event
) -> tuple[Counter[str], list[int], threading.Thread]:
    """Samples `sql` ((name, running) rows) until `done`: the most running
    seen per name, the number of samples (in a list, filled as it runs), and
    the sampling thread (joined before the test's database goes)."""
    worst: Counter[str] = Counter()
    samples = [0]

    def watch() -> None:
        with psycopg.connect(database_url, autocommit=True) as conn:
            while not done.is_set():
                for name, running in conn.execute(sql).fetchall():
                    worst[name] = max(worst[name], running)
                samples[0] += 1

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return worst, samples, watcher


@pytest.mark.parametrize("together", [False, True], ids=["apart", "with-completions"])
def test_limits_on_keys_hold_under_racing_claims(database_url: str, together: bool) -> None:
    """Keys over every tenant (one shared key, one key per tenant), with
    limited tenants among them and unkeyed tasks between: racing claimers
    never run more of a key than its limit, park and bring back its tasks
    without losing one, and leave every counter at zero."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        db.transact(conn, core.configure_tenant("a", concurrency_limit=2))
        db.transact(conn, core.set_limit(Limit("api", concurrency=3), "test"))
        db.transact(conn, core.set_limit(Limit("per", concurrency=1, per="{tenant}"), "test"))
        db.transact(conn, core.set_limit(Limit("metered", rate=1e5, burst=1e5), "test"))
        tasks = []
        for tenant in ["a", "b", "c", "d"]:
            tasks += envelopes(tenant, 60, limit_key="api")
            tasks += envelopes(tenant, 40, limit_key=f"per/{tenant}")
            tasks += envelopes(tenant, 20, limit_key="metered")
            tasks += envelopes(tenant, 30)
        random.Random(7).shuffle(tasks)
        load(conn, tasks)
    done = threading.Event()
    worst, samples, watcher = _watch(
        database_url,
        "SELECT t.limit_key, count(*) FROM rota.running r JOIN rota.tasks t ON t.id = r.task_id "
        "WHERE t.limit_key IS NOT NULL GROUP BY 1",
        done,
    )
    try:
        assert _race(database_url, _claim_and_run(together)) == []
    finally:
        done.set()
        watcher.join(30)
    assert samples[0] > 10
    assert 1 <= worst["api"] <= 3, worst
    for tenant in "abcd":
        assert worst[f"per/{tenant}"] == 1, worst
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM rota.finished").fetchone() == (600,)
        assert conn.execute("SELECT count(*) FROM rota.tasks").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM rota.parked").fetchone() == (0,)
        keys = dict(conn.execute("SELECT name, running FROM rota.keys").fetchall())
        assert keys == {"api": 0, "metered": 0, **{f"per/{t}": 0 for t in "abcd"}}


@pytest.mark.parametrize("together", [False, True], ids=["apart", "with-completions"])
def test_concurrency_limits_hold_under_racing_claims(database_url: str, together: bool) -> None:
    """With completions sent with the next claim (as workers do), claims lock
    tenant rows while the completions' row locks are held: no two claimers
    deadlock, and the limits hold as they do apart."""
    limits = {"a": 1, "b": 2, "c": 3}
    with psycopg.connect(database_url, autocommit=True) as conn:
        for tenant, limit in limits.items():
            db.transact(conn, core.configure_tenant(tenant, concurrency_limit=limit))
        # Rate-limited but never short of tokens: its row is locked by claims.
        db.transact(conn, core.configure_tenant("metered", rate_limit=1e5, rate_burst=1e5))
        load(conn, [e for t in [*limits, "free", "metered"] for e in envelopes(t, 150)])
    done = threading.Event()
    worst, samples, watcher = _watch(
        database_url,
        "SELECT tn.name, count(*) FROM rota.running r "
        "JOIN rota.tenants tn ON tn.id = r.tenant_id GROUP BY tn.name",
        done,
    )
    try:
        assert _race(database_url, _claim_and_run(together)) == []
    finally:
        done.set()
        watcher.join(30)
    assert samples[0] > 10
    for tenant, limit in limits.items():
        assert 1 <= worst[tenant] <= limit, (tenant, worst[tenant])
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert db.run(conn, core.queue_counts())["default"] == {
            "ready": 0,
            "running": 0,
            "scheduled": 0,
            "parked": 0,
        }
        counters = dict(conn.execute("SELECT name, running FROM rota.tenants").fetchall())
        assert counters == {"a": 0, "b": 0, "c": 0, "free": 0, "metered": 0}
        assert conn.execute("SELECT count(*) FROM rota.finished").fetchone() == (750,)
        assert conn.execute("SELECT count(*) FROM rota.tasks").fetchone() == (0,)


@pytest.mark.parametrize("together", [False, True], ids=["apart", "with-completions"])
def test_a_limit_set_and_lifted_while_claims_race_keeps_its_counter_right(
    database_url: str, together: bool
) -> None:
    """No tenant is limited, so claims and completions take their lean
    statements, while a tenant's limit is set and lifted again and again:
    every completion completes what it was given, and with the limit left
    set while tasks still run, its counter ends at zero."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        load(conn, [e for t in ["a", "b", "c"] for e in envelopes(t, 600)])
    turns = [0]

    def toggle() -> None:
        with psycopg.connect(database_url, autocommit=True) as conn:
            rng = random.Random(3)
            for turn in range(5):  # set, lifted, set, lifted, set
                limit = None if turn % 2 else 1_000  # never holds a task back
                with conn.transaction():
                    if turn == 4:  # the last set comes with tasks still to run
                        db.run(conn, core.load(envelopes("a", 300)))
                    db.run(conn, core.configure_tenant("a", concurrency_limit=limit))
                turns[0] += 1
                time.sleep(rng.uniform(0, 0.005))

    toggler = threading.Thread(target=toggle, daemon=True)
    toggler.start()
    try:
        assert _race(database_url, _claim_and_run(together, toggler.is_alive)) == []
    finally:
        toggler.join(30)
    assert turns[0] == 5
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM rota.finished").fetchone() == (2100,)
        assert conn.execute("SELECT count(*) FROM rota.running").fetchone() == (0,)
        counters = dict(conn.execute("SELECT name, running FROM rota.tenants").fetchall())
        assert counters == {"a": 0, "b": 0, "c": 0}


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


def test_a_completion_holding_a_limited_tenant_waits_on_no_other_tenant(
    database_url: str,
) -> None:
    """A worker that completes a limited tenant's task holds that tenant's row
    until it commits. Were its claim to follow in the same transaction, it
    would wait for another limited tenant's row, and two workers doing so in
    crossed order would deadlock. The statement that completes and claims
    leaves the claim apart then, so it never waits on the other row."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        for tenant in ("a", "b"):
            db.transact(conn, core.configure_tenant(tenant, concurrency_limit=2))
        load(conn, envelopes("a", 2) + envelopes("b", 2))
        (held,) = db.transact(conn, core.claim(["default"], 1, "w1"))
        assert held.tenant == "a"
    with psycopg.connect(database_url) as other:
        # Another worker's completion of a "b" task, not yet committed.
        other.execute("SELECT FROM rota.tenants WHERE name = 'b' FOR UPDATE")
        outcome: list[Any] = []

        def settle() -> None:
            with psycopg.connect(database_url, autocommit=True) as conn:
                outcome.append(
                    db.run(conn, core.complete_and_claim([held.token], ["default"], 10, "w1"))
                )

        settling = threading.Thread(target=settle)
        settling.start()
        settling.join(timeout=30)
        assert not settling.is_alive(), "the statement waits for the other tenant's row"
        other.rollback()
    assert outcome == [core.Settled(1, None)]
