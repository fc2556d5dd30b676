"""The queue core against a real PostgreSQL: loading, fair order, outcomes, limits."""

from __future__ import annotations

import dataclasses
import itertools
import math
import struct
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from rota import core
from rota.core import db
from rota.core.arrays import Float8Array, Int4Array
from rota.core.db import UUIDArray
from rota.core.effects import drive
from rota.core.load import SMALL_LOAD
from rota.errors import InvalidName, ValidationError
from rota.model.envelope import make_envelope, new_task_id
from rota.sql import query
from tests.helpers import claim, drain_order, envelopes, load, wait_for, waiting_on_a_lock

Conn = psycopg.Connection[Any]


# A small load is one INSERT that skips stored ids; a larger one a COPY that
# rolls back to its savepoint when it meets one.
SIZES = pytest.mark.parametrize("size", [20, SMALL_LOAD + 20], ids=["insert", "copy"])


@SIZES
def test_loading_the_same_batch_twice_creates_each_task_once(conn: Conn, size: int) -> None:
    batch = envelopes("alice", size)
    assert load(conn, batch) == size
    assert load(conn, batch) == 0
    assert load(conn, batch[:10] + envelopes("alice", size - 5)) == size - 5
    assert db.run(conn, core.queue_counts())["default"]["ready"] == 2 * size - 5


def test_duplicate_ids_inside_one_batch_are_loaded_once(conn: Conn) -> None:
    batch = envelopes("alice", 3)
    assert load(conn, batch + batch) == 3


@SIZES
def test_a_batch_racing_its_own_copy_is_loaded_once(
    conn: Conn, database_url: str, size: int
) -> None:
    # The second load waits on the first's uncommitted rows, finds their ids
    # once they commit, and loads only what is new.
    batch = envelopes("alice", size)
    late = envelopes("bob", 5)
    outcome: list[int] = []
    with db.connect(database_url) as other:
        racer = threading.Thread(
            target=lambda: outcome.append(db.transact(other, core.load(batch + late)))
        )
        with conn.transaction():
            assert db.run(conn, core.load(batch)) == size
            racer.start()
            pid = other.info.backend_pid
            with db.connect(database_url) as watcher:
                wait_for(lambda: waiting_on_a_lock(watcher, pid), what="the racer to wait")
            assert outcome == []
        racer.join(timeout=30)
    assert outcome == [5]
    counts = db.run(conn, core.queue_counts())["default"]
    assert counts["ready"] == size + 5
    assert sorted(drain_order(conn)) == ["alice"] * size + ["bob"] * 5


def test_loads_of_one_queue_take_turns_so_each_reads_settled_tags(
    conn: Conn, database_url: str
) -> None:
    # A second load of the queue waits for the first to commit before it
    # reads the tenant's finish tag: otherwise both would give alice the
    # same places in line.
    load(conn, envelopes("alice", 1))  # alice and the queue exist: no name to wait on
    first, second = envelopes("alice", 3), envelopes("alice", 3)
    outcome: list[int] = []
    with db.connect(database_url) as other:
        racer = threading.Thread(
            target=lambda: outcome.append(db.transact(other, core.load(second)))
        )
        with conn.transaction():
            assert db.run(conn, core.load(first)) == 3
            racer.start()
            pid = other.info.backend_pid
            with db.connect(database_url) as watcher:
                wait_for(lambda: waiting_on_a_lock(watcher, pid), what="the second load to wait")
            assert outcome == []
        racer.join(timeout=30)
    assert outcome == [3]
    places = conn.execute(
        "SELECT r.vtime FROM rota.ready r JOIN rota.tasks t ON t.id = r.task_id"
        " WHERE t.tenant = 'alice' ORDER BY t.seq"
    ).fetchall()
    assert [p for (p,) in places] == sorted({p for (p,) in places})  # seven places, in turn
    assert len(places) == 7


def test_a_task_finishing_while_its_batch_is_loaded_again_is_not_loaded_again(
    conn: Conn, database_url: str
) -> None:
    # A cron tick is offered again while it runs: the load's first look finds
    # it running (not finished), it finishes, then the COPY fails on another
    # task of the batch and the load looks again. The task must not come back.
    x, y = envelopes("alice", 2)
    fresh = envelopes("bob", SMALL_LOAD)  # enough for a COPY
    load(conn, [x])
    with db.connect(database_url) as other:
        (running,) = claim(other, limit=1)
        load(conn, [y])  # loading [x, y, ...] again fails on y

        looks = itertools.count()

        def execute(request: Any) -> Any:
            def one() -> Any:
                return (yield request)

            outcome = db.run(conn, one())
            if getattr(request, "query", None) == query("load_prepare") and not next(looks):
                assert db.transact(other, core.complete([running.token])) == {x.id}
            return outcome

        with conn.transaction():
            assert drive(core.load([x, y, *fresh]), execute) == SMALL_LOAD
    assert conn.execute("SELECT count(*) FROM rota.tasks WHERE id = %s", [x.id]).fetchone() == (0,)
    finished = conn.execute("SELECT count(*) FROM rota.finished WHERE task_id = %s", [x.id])
    assert finished.fetchone() == (1,)


@SIZES
def test_a_task_finishing_while_its_row_is_inserted_again_is_not_loaded_again(
    conn: Conn, database_url: str, size: int
) -> None:
    # The load looks at rota.finished before the task's completion commits;
    # its insert then waits on the row's deletion and, once it commits,
    # stores the row again. The insert trigger's second look takes it out.
    (x,) = envelopes("alice", 1)
    fresh = envelopes("bob", size - 1)
    load(conn, [x])
    outcome: list[int] = []
    with db.connect(database_url) as worker, db.connect(database_url) as loader:
        (running,) = claim(worker, limit=1)
        with worker.transaction():
            assert db.run(worker, core.complete([running.token])) == {x.id}
            racer = threading.Thread(
                target=lambda: outcome.append(db.transact(loader, core.load([x, *fresh])))
            )
            racer.start()
            pid = loader.info.backend_pid
            with db.connect(database_url) as watcher:
                wait_for(lambda: waiting_on_a_lock(watcher, pid), what="the load to wait on x")
        racer.join(timeout=30)
    assert len(outcome) == 1
    assert conn.execute("SELECT count(*) FROM rota.tasks WHERE id = %s", [x.id]).fetchone() == (0,)
    places = conn.execute("SELECT count(*) FROM rota.ready WHERE task_id = %s", [x.id])
    assert places.fetchone() == (0,)
    assert sorted(drain_order(conn)) == ["bob"] * (size - 1)


def test_a_flood_does_not_push_a_small_tenant_back(conn: Conn) -> None:
    load(conn, envelopes("flood", 300))
    load(conn, envelopes("small", 2))
    order = drain_order(conn, batch=1)
    # The late tenant gets the next round's slot: served at once, then again next round.
    assert order.index("small") <= 1
    assert [i for i, t in enumerate(order) if t == "small"][1] <= 3


def test_equal_weights_take_one_turn_each_per_round(conn: Conn) -> None:
    load(conn, envelopes("a", 5) + envelopes("b", 3) + envelopes("c", 1))
    order = drain_order(conn, batch=4)
    assert order == ["a", "b", "c", "a", "b", "a", "b", "a", "a"]


def test_weights_give_proportional_shares(conn: Conn) -> None:
    db.transact(conn, core.configure_tenant("gold", weight=2))
    load(conn, envelopes("gold", 300) + envelopes("x", 300) + envelopes("y", 300))
    first = [t.tenant for t in claim(conn, 400)]
    assert first.count("gold") == 200
    assert first.count("x") == 100
    assert first.count("y") == 100


def test_cost_counts_against_the_tenants_share(conn: Conn) -> None:
    load(conn, envelopes("heavy", 20, cost=4) + envelopes("light", 40))
    first = [t.tenant for t in claim(conn, 25)]
    assert first.count("light") == 20
    assert first.count("heavy") == 5


def test_a_future_eta_waits_scheduled_then_gets_a_fresh_fair_place(conn: Conn) -> None:
    soon = datetime.now(UTC) + timedelta(seconds=1)
    load(conn, envelopes("later", 1, eta=soon) + envelopes("now", 3))
    assert db.run(conn, core.queue_counts())["default"] == {
        "ready": 3,
        "running": 0,
        "scheduled": 1,
        "parked": 0,
    }
    assert db.transact(conn, core.promote_due()) == 0
    wait_for(lambda: db.transact(conn, core.promote_due()), what="the eta")
    # Promoted into the current round, not behind the rest of the backlog.
    assert "later" in [t.tenant for t in claim(conn, 2)]


def test_complete_and_stale_tokens_are_refused(conn: Conn) -> None:
    load(conn, envelopes("alice", 2))
    first, second = claim(conn, 2)
    assert db.transact(conn, core.complete([first.token])) == {first.id}
    assert db.transact(conn, core.complete([first.token])) == set()
    stale = (second.id, second.attempt + 1)
    assert db.transact(conn, core.complete([stale])) == set()
    states = db.run(conn, core.task_states([first.id, second.id]))
    assert states[first.id].status == "succeeded"
    assert states[second.id].status == "running"


def test_completions_and_the_next_claim_go_in_one_statement(conn: Conn) -> None:
    load(conn, envelopes("alice", 3) + envelopes("bob", 3))
    first, second = claim(conn, 2, worker="w1")
    stale = (second.id, second.attempt + 1)
    tokens = [first.token, stale]
    settled = db.transact(conn, core.complete_and_claim(tokens, ["default"], 4, "w1"))
    assert settled.completed == 1  # the stale token is refused
    # Claimed in the fair order a claim of its own would take.
    assert [t.tenant for t in settled.claimed or []] == ["alice", "bob", "alice", "bob"]
    states = db.run(conn, core.task_states([first.id, second.id]))
    assert states[first.id].status == "succeeded"
    assert states[second.id].status == "running"
    held = [second.token, *(t.token for t in settled.claimed or [])]
    # Nothing left to claim: the completions go through all the same.
    settled = db.transact(conn, core.complete_and_claim(held, ["default"], 10, "w1"))
    assert settled == core.Settled(5, [])
    assert claim(conn, 10) == []
    assert db.transact(conn, core.complete_and_claim([], ["default"], 1, "w1")) == (0, [])


def test_a_completion_that_uncounts_a_limited_tenant_leaves_the_claim_apart(conn: Conn) -> None:
    # Its tenant's row is locked until the transaction ends; a claim in the
    # same transaction would lock other tenants' rows after it, and two
    # workers doing so in crossed order would deadlock.
    db.transact(conn, core.configure_tenant("capped", concurrency_limit=1))
    load(conn, envelopes("capped", 3) + envelopes("free", 3))
    capped, free = claim(conn, 2)
    assert (capped.tenant, free.tenant) == ("capped", "free")
    settled = db.transact(conn, core.complete_and_claim([capped.token], ["default"], 5, "w"))
    assert settled == core.Settled(1, None)
    # The uncounted slot is free again for the claim that follows.
    assert [t.tenant for t in claim(conn, 1)] == ["capped"]
    # A completion of an unlimited tenant claims in the same statement, and
    # the limit holds there: the capped tenant's third task waits.
    settled = db.transact(conn, core.complete_and_claim([free.token], ["default"], 5, "w"))
    assert settled.completed == 1
    assert [t.tenant for t in settled.claimed or []] == ["free", "free"]


def test_failures_retry_with_backoff_then_die_keeping_the_last_error(conn: Conn) -> None:
    load(conn, envelopes("alice", 1, max_attempts=2, backoff_base=0.2))
    (task,) = claim(conn, 1)
    before = datetime.now(UTC)
    (outcome,) = db.transact(conn, core.fail([core.Failure(task.id, task.attempt, "first")]))
    after = datetime.now(UTC)
    assert outcome.status == "scheduled"
    assert outcome.run_at is not None
    # Equal jitter: between half and all of the base delay after the failure's
    # transaction began, which was between `before` and `after` (however slow
    # the machine).
    assert before + timedelta(seconds=0.1) <= outcome.run_at <= after + timedelta(seconds=0.2)
    assert claim(conn, 1) == []
    wait_for(lambda: db.transact(conn, core.promote_due()), what="the backoff")
    (again,) = claim(conn, 1)
    assert again.attempt == 2
    (dead,) = db.transact(conn, core.fail([core.Failure(again.id, again.attempt, "second")]))
    assert dead.status == "dead"
    state = db.run(conn, core.task_states([task.id]))[task.id]
    assert (state.status, state.attempts, state.last_error) == ("dead", 2, "second")


def test_nul_characters_survive_in_arguments_and_errors(conn: Conn) -> None:
    envelope = make_envelope(
        name="tests.noop", queue="default", tenant="alice", args=["a\x00b"], kwargs={"k\x00": 1}
    )
    load(conn, [envelope])
    (task,) = claim(conn, 1)
    assert (task.args, task.kwargs) == (["a\x00b"], {"k\x00": 1})
    failure = core.Failure(task.id, task.attempt, "ValueError: bad byte \x00 here", final=True)
    (dead,) = db.transact(conn, core.fail([failure]))
    assert dead.status == "dead"
    state = db.run(conn, core.task_states([task.id]))[task.id]
    assert state.last_error == "ValueError: bad byte \\x00 here"


def test_backoff_grows_exponentially(conn: Conn) -> None:
    delays = [
        row[0]
        for row in conn.execute(
            "SELECT rota.backoff_seconds(a, 1, 3600) FROM generate_series(1, 8) a"
        )
    ]
    for attempt, delay in enumerate(delays, start=1):
        assert 2 ** (attempt - 1) / 2 <= delay <= 2 ** (attempt - 1)
    assert conn.execute("SELECT rota.backoff_seconds(40, 1, 60)").fetchone()[0] <= 60


def test_an_explicit_retry_time_is_kept(conn: Conn) -> None:
    load(conn, envelopes("alice", 1))
    (task,) = claim(conn, 1)
    at = datetime.now(UTC) + timedelta(minutes=5)
    (outcome,) = db.transact(conn, core.fail([core.Failure(task.id, task.attempt, "later", at)]))
    assert outcome.run_at == at


def test_expired_leases_are_requeued_and_the_old_holder_is_fenced(conn: Conn) -> None:
    load(conn, envelopes("alice", 1))
    (task,) = claim(conn, 1, lease_seconds=0.2)
    assert wait_for(lambda: db.transact(conn, core.requeue_expired())) == {task.id}
    (again,) = claim(conn, 1, worker="other")
    assert again.id == task.id and again.attempt == task.attempt + 1
    assert db.transact(conn, core.complete([task.token])) == set()
    assert db.transact(conn, core.extend_leases([task.token], 60)) == set()
    assert db.transact(conn, core.extend_leases([again.token], 60)) == {task.id}
    assert db.transact(conn, core.complete([again.token])) == {task.id}


def test_a_report_past_the_lease_is_refused_before_any_requeue(conn: Conn) -> None:
    """A worker silent past its lease (partitioned, frozen) holds nothing: its
    completion is refused even while no one has requeued the task yet, and
    the task runs again."""
    load(conn, envelopes("alice", 1))
    (task,) = claim(conn, 1, lease_seconds=0.2)
    wait_for(
        lambda: (
            conn.execute(
                "SELECT lease_expires_at < now() FROM rota.running WHERE task_id = %s", [task.id]
            ).fetchone()
            == (True,)
        ),
        what="the lease to pass",
    )
    assert db.transact(conn, core.complete([task.token])) == set()
    assert db.transact(conn, core.extend_leases([task.token], 60)) == set()
    assert db.transact(conn, core.requeue_expired()) == {task.id}
    (again,) = claim(conn, 1)
    assert again.id == task.id and again.attempt == task.attempt + 1


def test_a_lease_expiring_on_the_last_attempt_dead_letters(conn: Conn) -> None:
    load(conn, envelopes("alice", 1, max_attempts=1))
    (task,) = claim(conn, 1, lease_seconds=0.1)

    def dead() -> bool:
        assert db.transact(conn, core.requeue_expired()) == set()  # never requeued
        return db.run(conn, core.task_states([task.id]))[task.id].status == "dead"

    wait_for(dead, what="the lease to expire")
    state = db.run(conn, core.task_states([task.id]))[task.id]
    assert (state.status, state.last_error) == ("dead", "lease expired")


def test_released_tasks_keep_their_place_and_their_attempt(conn: Conn) -> None:
    load(conn, envelopes("a", 2) + envelopes("b", 2))
    got = claim(conn, 2)
    assert db.transact(conn, core.release([t.token for t in got])) == {t.id for t in got}
    again = claim(conn, 2)
    assert [t.id for t in again] == [t.id for t in got]
    assert [t.attempt for t in again] == [1, 1]


def test_claims_only_take_the_asked_queues(conn: Conn) -> None:
    load(conn, envelopes("a", 3, queue="pdfs") + envelopes("a", 3, queue="mail"))
    assert {t.queue for t in claim(conn, 10, queues=("pdfs",))} == {"pdfs"}
    both = claim(conn, 10, queues=("pdfs", "mail"))
    assert {t.queue for t in both} == {"mail"}
    assert claim(conn, 10, queues=("unknown",)) == []


def test_multi_queue_claims_merge_in_fair_order(conn: Conn) -> None:
    load(conn, envelopes("a", 3, queue="q1") + envelopes("b", 3, queue="q2"))
    got = claim(conn, 6, queues=("q1", "q2"))
    assert [t.tenant for t in got] == ["a", "b", "a", "b", "a", "b"]


def test_claims_name_each_tasks_tenant_copied_or_not(conn: Conn) -> None:
    load(conn, envelopes("acme", 2) + envelopes("globex", 2))
    assert conn.execute("SELECT DISTINCT tenant FROM rota.tasks ORDER BY 1").fetchall() == [
        ("acme",),
        ("globex",),
    ]
    # Tasks loaded before migration 0011 have no copy of the name.
    conn.execute("UPDATE rota.tasks SET tenant = NULL WHERE tenant = 'globex'")
    assert sorted(t.tenant for t in claim(conn, 4)) == ["acme", "acme", "globex", "globex"]


def test_concurrency_limit_holds_back_extra_tasks_without_using_attempts(conn: Conn) -> None:
    db.transact(conn, core.configure_tenant("capped", concurrency_limit=2))
    load(conn, envelopes("capped", 5) + envelopes("free", 5))
    got = claim(conn, 10)
    assert [t.tenant for t in got].count("capped") == 2
    assert claim(conn, 10) == []
    db.transact(conn, core.complete([next(t.token for t in got if t.tenant == "capped")]))
    (next_one,) = claim(conn, 10)
    assert next_one.tenant == "capped" and next_one.attempt == 1


def test_a_completion_of_counted_and_uncounted_tasks_keeps_every_counter(conn: Conn) -> None:
    # Uncounted tasks complete in the lean statement, counted ones in the
    # whole one: a batch mixing them, and tasks counted after their claim
    # (a limit set while they ran), leave each tenant's counter right.
    load(conn, envelopes("late", 3) + envelopes("free", 3))
    early = claim(conn, 6)
    db.transact(conn, core.configure_tenant("late", concurrency_limit=5))
    db.transact(conn, core.configure_tenant("capped", concurrency_limit=5))
    load(conn, envelopes("capped", 3))
    capped = claim(conn, 3)
    stale = (capped[0].id, capped[0].attempt + 1)
    tokens = [t.token for t in early + capped]
    assert db.transact(conn, core.complete([*tokens, stale])) == {t.id for t in early + capped}
    running = dict(conn.execute("SELECT name, running FROM rota.tenants").fetchall())
    assert running == {"late": 0, "free": 0, "capped": 0}
    assert conn.execute("SELECT count(*) FROM rota.running").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM rota.finished").fetchone() == (9,)


def test_rate_limit_throttles_without_failing(conn: Conn) -> None:
    db.transact(conn, core.configure_tenant("slow", rate_limit=5, rate_burst=2))
    load(conn, envelopes("slow", 10))
    started = time.monotonic()
    assert len(claim(conn, 10)) == 2  # the burst
    assert claim(conn, 10) == []
    got: list[core.ClaimedTask] = []
    wait_for(lambda: got.extend(claim(conn, 10)) or len(got) >= 2, what="two more tokens")
    # 5 tokens a second: the next two took about 0.4 s to come, and no
    # throttled claim used an attempt.
    assert time.monotonic() - started >= 0.3
    assert len(got) >= 2 and {t.attempt for t in got} == {1}


def test_backlog_estimate_tracks_waiting_work(conn: Conn) -> None:
    db.transact(conn, core.configure_tenant("alice", capacity=100))
    load(conn, envelopes("alice", 30) + envelopes("bob", 10, cost=2))
    assert db.run(conn, core.tenant_backlogs()) == {"alice": (100, 30.0)}  # capacities only
    bob = conn.execute("SELECT capacity, backlog FROM rota.tenant_backlog WHERE tenant = 'bob'")
    assert bob.fetchone() == (None, 20.0)
    got = claim(conn, 10)
    db.transact(conn, core.complete(t.token for t in got))
    # 7 of alice's 30 were claimed; the estimate may run up to one round ahead.
    assert 23 <= db.run(conn, core.tenant_backlogs())["alice"][1] <= 24


def test_backlog_estimate_adds_up_a_tenants_queues(conn: Conn) -> None:
    db.transact(conn, core.configure_tenant("alice", capacity=100, weight=2))
    # Each queue has its own clock: bob's tasks run ahead of it in "b" only.
    load(
        conn,
        envelopes("alice", 6) + envelopes("bob", 4, queue="b") + envelopes("alice", 3, queue="b"),
    )
    assert db.run(conn, core.tenant_backlogs()) == {"alice": (100, 9.0)}


def test_loading_notifies_once_per_batch(conn: Conn, database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN rota_ready")
        load(conn, envelopes("a", 500) + envelopes("b", 500, queue="other"))
        notes = list(listener.notifies(timeout=0.5))
    assert sorted(n.payload for n in notes) == ["default", "other"]


@pytest.mark.parametrize(
    "change",
    [
        {"weight": 0},
        {"weight": -1},
        {"weight": 1e-9},
        {"weight": 1e9},
        {"weight": math.nan},
        {"concurrency_limit": -1},
        {"capacity": -5},
        {"rate_limit": 0},
        {"rate_burst": 0.5},
    ],
)
def test_bad_tenant_settings_are_refused(conn: Conn, change: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        db.transact(conn, core.configure_tenant("alice", **change))
    assert conn.execute("SELECT count(*) FROM rota.tenants").fetchone() == (0,)


def test_the_database_bounds_weights_and_costs_too(conn: Conn) -> None:
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO rota.tenants (name, weight) VALUES ('a', 1e9)")
    db.transact(conn, core.configure_tenant("a", weight=1e6))
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("UPDATE rota.tenants SET weight = 1e-9 WHERE name = 'a'")
    envelope = dataclasses.replace(envelopes("a", 1)[0], cost=1e7)
    with pytest.raises(psycopg.errors.CheckViolation):
        load(conn, [envelope])


@pytest.mark.parametrize("name", ["", "Bad Name", "-x", "x" * 200, "a/b", "naïve"])
def test_bad_tenant_names_are_refused_by_python_and_by_the_database(conn: Conn, name: str) -> None:
    with pytest.raises(InvalidName):
        db.transact(conn, core.configure_tenant(name))
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO rota.tenants (name) VALUES (%s)", [name])


def test_a_batch_with_a_bad_row_writes_nothing(conn: Conn) -> None:
    good = envelopes("alice", 3)
    bad = make_envelope(name="tests.noop", queue="default", tenant="alice")
    broken = dataclasses.replace(bad, tenant="not valid!")
    with pytest.raises(psycopg.errors.CheckViolation):
        load(conn, [*good, broken])
    assert conn.execute("SELECT count(*) FROM rota.tasks").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM rota.tenants").fetchone() == (0,)


def test_a_batch_loaded_again_after_its_tasks_ran_creates_nothing(conn: Conn) -> None:
    batch = envelopes("alice", 4)
    load(conn, batch)
    got = claim(conn, 2)
    db.transact(conn, core.complete(t.token for t in got))
    assert load(conn, batch) == 0
    assert db.run(conn, core.queue_counts())["default"]["ready"] == 2
    states = db.run(conn, core.task_states([e.id for e in batch]))
    assert sorted(s.status for s in states.values()) == [
        "pending",
        "pending",
        "succeeded",
        "succeeded",
    ]


def test_finished_records_can_be_pruned(conn: Conn) -> None:
    load(conn, envelopes("alice", 3))
    db.transact(conn, core.complete(t.token for t in claim(conn, 3)))
    assert db.transact(conn, core.prune_finished(3600)) == 0
    assert db.transact(conn, core.prune_finished(0)) == 3


@pytest.mark.parametrize("count", [0, 1, 3])
def test_task_id_arrays_reach_the_server_whole(conn: Conn, count: int) -> None:
    ids = [new_task_id() for _ in range(count)]
    sent, length = conn.execute(
        "SELECT %(ids)b::uuid[], cardinality(%(ids)b::uuid[])", {"ids": UUIDArray(ids)}
    ).fetchone()  # type: ignore[misc]
    assert (sent, length) == (ids, count)


def test_attempts_and_run_times_arrays_reach_the_server_whole(conn: Conn) -> None:
    attempts = Int4Array([1, 3, 2**31 - 1, -(2**31)])
    times = Float8Array([0.25, None, 1e-9, 3600.0, None])
    sent = conn.execute(
        "SELECT %(a)b::integer[], %(t)b::float8[], %(e)b::integer[], %(f)b::float8[]",
        {"a": attempts, "t": times, "e": Int4Array(), "f": Float8Array()},
    ).fetchone()
    assert sent == (list(attempts), list(times), [], [])
    with pytest.raises(struct.error):  # not an int4: refused before the server
        conn.execute("SELECT %(a)b::integer[]", {"a": Int4Array([2**31])})


def test_task_ids_given_as_text_are_parsed_and_bad_ones_refused(conn: Conn) -> None:
    task_id = new_task_id()
    (sent,) = conn.execute(
        "SELECT %(ids)b::uuid[]",
        {"ids": UUIDArray([str(task_id)])},  # type: ignore[list-item]
    ).fetchone()  # type: ignore[misc]
    assert sent == [task_id]
    with pytest.raises(ValueError, match="hexadecimal UUID"):
        db.run(conn, core.task_states(["not-an-id"]))  # type: ignore[list-item]


def test_places_in_line_follow_start_time_fair_queueing(conn: Conn) -> None:
    # The places are computed by the database (rota.load_tasks), from the
    # rules alone: a tenant's next task starts at S = max(V, F) and moves its
    # finish tag F on by cost / weight; nothing waits yet, so V stays 0.
    db.transact(conn, core.configure_tenant("heavy", weight=2.0))
    sent: list[tuple[str, float]] = []
    for _ in range(3):
        batch = [
            e
            for tenant, cost in (("light", 1.0), ("heavy", 3.0), ("light", 0.5))
            for e in envelopes(tenant, 4, queue="rules", cost=cost)
        ]
        sent += [(e.tenant, e.cost) for e in batch]
        load(conn, batch)
    finish: dict[str, float] = {}
    expected = []
    for arrival, (tenant, cost) in enumerate(sent):
        start = max(0.0, finish.get(tenant, 0.0))
        finish[tenant] = start + cost / (2.0 if tenant == "heavy" else 1.0)
        expected.append((tenant, start, arrival))
    placed = conn.execute(
        "SELECT t.name, r.vtime, r.seq - min(r.seq) OVER () FROM rota.ready r"
        " JOIN rota.tenants t ON t.id = r.tenant_id JOIN rota.queues q ON q.id = r.queue_id"
        " WHERE q.name = 'rules' ORDER BY r.seq"
    ).fetchall()
    assert [(n, pytest.approx(v), a) for n, v, a in placed] == expected
    tags = conn.execute(
        "SELECT t.name, tq.finish_tag FROM rota.tenant_queues tq"
        " JOIN rota.tenants t ON t.id = tq.tenant_id JOIN rota.queues q ON q.id = tq.queue_id"
        " WHERE q.name = 'rules' ORDER BY t.name"
    ).fetchall()
    assert tags == [(t, pytest.approx(finish[t])) for t in sorted(finish)]
    last = conn.execute(
        "SELECT t.name, tq.last_start FROM rota.tenant_queues tq"
        " JOIN rota.tenants t ON t.id = tq.tenant_id JOIN rota.queues q ON q.id = tq.queue_id"
        " WHERE q.name = 'rules' ORDER BY t.name"
    ).fetchall()
    assert last == [
        (t, pytest.approx(max(v for n, v, _ in expected if n == t))) for t in ("heavy", "light")
    ]
    # Once nothing waits, the clock is the largest start given (loads never
    # write the queue's row: its floor stays 0).
    conn.execute(
        "DELETE FROM rota.ready WHERE queue_id = (SELECT id FROM rota.queues WHERE name = 'rules')"
    )
    (clock, floor) = conn.execute(  # type: ignore[misc]
        "SELECT rota.vclock(id), max_start FROM rota.queues WHERE name = 'rules'"
    ).fetchone()
    assert (clock, floor) == (pytest.approx(max(v for _, v, _ in expected)), 0)
