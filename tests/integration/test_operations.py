"""Operators' actions and the read model against real servers: cancel,
retry, pause, tenant changes, the audit log, figures, and why a task waits
in each situation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import redis

from rota import App, Settings, core
from rota.core import db, history, read, stored
from rota.errors import ValidationError
from rota.readmodel.story import task_story
from tests.helpers import claim, envelopes, load, wait_for

Conn = psycopg.Connection[Any]
ME = "test:operator"


def audit_rows(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT actor, action, target, count FROM rota.audit ORDER BY id"
    ).fetchall()


def status(conn: Conn, task_id: Any) -> str:
    return db.run(conn, core.task_states([task_id]))[task_id].status


def test_cancel_takes_waiting_tasks_at_once_and_running_ones_at_their_end(conn: Conn) -> None:
    (ready,) = envelopes("alice", 1)
    (later,) = envelopes("alice", 1, eta=datetime.now(UTC) + timedelta(hours=1))
    (busy,) = envelopes("bob", 1, max_attempts=5)
    load(conn, [ready, later, busy])
    got = db.transact(conn, core.claim(["default"], 10, "w1"))
    claimed = next(t for t in got if t.id == busy.id)
    # The claim took the ready ones; put alice's back to have one waiting in line.
    db.transact(conn, core.release([t.token for t in got if t.id != busy.id]))

    outcomes = db.run(conn, core.cancel([ready.id, later.id, busy.id], ME))
    assert outcomes == {ready.id: "cancelled", later.id: "cancelled", busy.id: "cancelling"}
    assert status(conn, ready.id) == status(conn, later.id) == "cancelled"
    assert claim(conn, 10) == []  # nothing left in line
    # The running one fails: not retried, although it has attempts left.
    (failed,) = db.transact(conn, core.fail([core.Failure(claimed.id, claimed.attempt, "boom")]))
    assert failed.status == "cancelled"
    assert audit_rows(conn) == [(ME, "cancel", "task", 3)]
    # Cancelling what ended changes nothing.
    assert db.run(conn, core.cancel([ready.id], ME)) == {ready.id: "cancelled"}


def test_a_cancelled_running_task_that_succeeds_counts_as_succeeded(conn: Conn) -> None:
    load(conn, envelopes("alice", 1))
    (task,) = claim(conn, 1)
    assert db.run(conn, core.cancel([task.id], ME)) == {task.id: "cancelling"}
    assert db.transact(conn, core.complete([task.token])) == {task.id}
    assert status(conn, task.id) == "succeeded"
    assert db.run(conn, core.cancel([task.id], ME)) == {task.id: "succeeded"}


def test_a_cancelled_task_whose_lease_expires_is_not_requeued(conn: Conn) -> None:
    load(conn, envelopes("alice", 1))
    (task,) = claim(conn, 1, lease_seconds=0.1)
    db.run(conn, core.cancel([task.id], ME))

    def expired() -> bool:
        assert db.transact(conn, core.requeue_expired()) == set()  # never back in line
        return status(conn, task.id) == "cancelled"

    wait_for(expired, what="the lease to expire")
    assert claim(conn, 1) == []


def test_retry_runs_dead_tasks_again_with_a_fresh_attempt_budget(conn: Conn) -> None:
    load(conn, envelopes("alice", 2, max_attempts=1) + envelopes("bob", 1, max_attempts=1))
    for task in claim(conn, 10):
        db.transact(conn, core.fail([core.Failure(task.id, task.attempt, "broken", final=True)]))
    dead = db.run(conn, read.tasks("dead", tenant="alice"))
    assert len(dead) == 2 and all(t.last_error == "broken" for t in dead)

    assert db.run(conn, core.retry([dead[0].id], ME)) == {dead[0].id}
    assert db.run(conn, core.retry([dead[0].id], ME)) == set()  # not dead any more
    assert db.transact(conn, core.promote_due()) == 1
    (again,) = claim(conn, 10)
    assert again.id == dead[0].id and again.attempt == 1  # same id, attempts from 1

    assert db.run(conn, core.retry_dead(ME, tenant="bob")) == 1
    assert db.run(conn, core.retry_dead(ME, queue="default")) == 1  # alice's other one
    assert db.run(conn, core.retry_dead(ME)) == 0
    since = datetime.now(UTC) + timedelta(minutes=1)
    assert db.run(conn, core.retry_dead(ME, since=since)) == 0
    actions = [(row[1], row[3]) for row in audit_rows(conn)]
    assert actions == [("retry", 1), ("retry", 0), ("retry", 1), ("retry", 1)]


def test_bad_input_to_actions_is_refused_before_anything_is_written(conn: Conn) -> None:
    with pytest.raises(ValidationError):
        core.retry_dead(ME, tenant="bad tenant\n")
    with pytest.raises(ValidationError):
        core.retry_dead(ME, limit=10**9)
    with pytest.raises(ValidationError):
        core.cancel(["not-a-uuid"], ME)  # type: ignore[list-item]
    with pytest.raises(ValidationError):
        core.patch_tenant("gold", {"weight": -1}, ME)
    with pytest.raises(ValidationError):
        core.patch_tenant("gold", {"colour": "red"}, ME)
    with pytest.raises(ValidationError):
        read.tenants(sort="name; DROP TABLE rota.tasks")
    assert audit_rows(conn) == []


def test_a_paused_queue_and_a_paused_tenant_wait_in_line(conn: Conn) -> None:
    load(conn, envelopes("alice", 2, queue="pdfs") + envelopes("bob", 2, queue="pdfs"))
    load(conn, envelopes("carol", 2, queue="mail"))
    assert db.run(conn, core.pause_queue("mail", True, ME)) is True
    assert db.run(conn, core.pause_tenant("alice", True, ME)) is True
    assert db.run(conn, core.pause_tenant("nobody", True, ME)) is False
    got = claim(conn, 10, queues=("pdfs", "mail"))
    assert sorted(t.tenant for t in got) == ["bob", "bob"]
    db.run(conn, core.pause_queue("mail", False, ME))
    db.run(conn, core.pause_tenant("alice", False, ME))
    again = claim(conn, 10, queues=("pdfs", "mail"))
    assert sorted(t.tenant for t in again) == ["alice", "alice", "carol", "carol"]
    assert [r[1] for r in audit_rows(conn)] == ["pause", "pause", "resume", "resume"]


def test_patching_a_tenant_changes_only_what_is_given(conn: Conn) -> None:
    db.transact(conn, core.configure_tenant("gold", weight=2, concurrency_limit=5, capacity=100))
    db.run(conn, core.patch_tenant("gold", {"weight": 3}, ME))
    gold = db.run(conn, read.tenant("gold"))
    assert gold is not None
    assert (gold.weight, gold.concurrency_limit, gold.capacity) == (3.0, 5, 100)
    db.run(conn, core.patch_tenant("gold", {"concurrency_limit": None, "rate_limit": 5}, ME))
    gold = db.run(conn, read.tenant("gold"))
    assert gold is not None
    assert (gold.concurrency_limit, gold.rate_limit, gold.capacity) == (None, 5.0, 100)
    db.run(conn, core.patch_tenant("newcomer", {"capacity": 10}, ME))
    assert db.run(conn, read.tenant("newcomer")) is not None


def test_figures_per_queue_and_tenant_come_from_the_maintenance_counts(conn: Conn) -> None:
    db.transact(conn, core.configure_tenant("big", weight=2, concurrency_limit=3))
    load(conn, envelopes("big", 30, queue="pdfs") + envelopes("small", 5, queue="pdfs"))
    got = claim(conn, 6, queues=("pdfs",))
    for task in got[:4]:
        db.transact(conn, core.complete([task.token]))
    conn.execute("UPDATE rota.finished SET finished_at = now() - interval '2 seconds'")
    assert db.run(conn, core.count_service()) == 4
    assert db.run(conn, core.refresh_stats()) > 0
    (pdfs,) = db.run(conn, read.queues())
    assert (pdfs.name, pdfs.waiting, pdfs.running) == ("pdfs", 35 - len(got), len(got) - 4)
    assert pdfs.per_minute == pytest.approx(4 / 5)
    assert pdfs.oldest_wait_seconds is not None and pdfs.oldest_wait_seconds >= 0

    page = db.run(conn, read.tenants(sort="waiting"))
    assert [t.name for t in page.rows] == ["big", "small"] and page.total == 2
    big = page.rows[0]
    claimed_big = sum(1 for t in got if t.tenant == "big")
    assert (big.waiting, big.concurrency_limit, big.weight) == (30 - claimed_big, 3, 2.0)
    assert big.running == sum(1 for t in got[4:] if t.tenant == "big")
    # Served, demand and fair share are over the last whole minutes: this
    # minute's completions count once it has ended.
    assert sum(t.served_per_minute for t in page.rows) == 0
    for table in ("rota.service", "rota.queue_history"):
        conn.execute(f"UPDATE {table} SET minute = minute - interval '1 minute'")
    page = db.run(conn, read.tenants(sort="served", descending=False))
    minutes = history.FAIR_MINUTES
    assert sum(t.served_per_minute for t in page.rows) * minutes == pytest.approx(4)
    assert [t.served_per_minute for t in page.rows] == sorted(
        t.served_per_minute for t in page.rows
    )
    # Asked for: completed, or unfinished (waiting or claimed) at the end.
    demand = {t.name: t.demand_per_minute * minutes for t in page.rows}
    assert demand == pytest.approx({"big": 30, "small": 5})
    # Water-filling 4 completions over weights 2 and 1: 8/3 and 4/3.
    fair = {t.name: t.fair_share_per_minute for t in page.rows}
    owed = {"big": 8 / 3 / minutes, "small": 4 / 3 / minutes}
    for t in page.rows:
        assert t.fair_standing is not None and t.fair_minutes == minutes
        if t.fair_standing != "at":  # else shown as served, within rounding
            assert fair[t.name] == pytest.approx(owed[t.name], abs=1e-3)
    by_name = db.run(conn, read.tenants(sort="name", descending=False, limit=1, offset=1))
    assert [t.name for t in by_name.rows] == ["small"] and by_name.total == 2
    assert db.run(conn, read.tenants(prefix="sm")).total == 1
    assert db.run(conn, read.tenants(prefix="%")).total == 0  # a prefix, not a pattern
    with pytest.raises(ValidationError, match="without NUL"):  # a text column holds none
        read.tenants(prefix="sm\x00")

    detail = db.run(conn, read.tenant("big"))
    assert detail is not None and detail.queues[0].queue == "pdfs"
    assert (
        sum(n for _, n, _ in detail.service)
        + sum(
            n
            for _, n, _ in db.run(conn, read.tenant("small")).service  # type: ignore[union-attr]
        )
        == 4
    )


def _stats(conn: Conn) -> dict[str, tuple[Any, ...]]:
    rows = conn.execute(
        "SELECT t.name, s.waiting, s.running, s.oldest_enqueued_at, s.xmin::text"
        " FROM rota.stats s JOIN rota.tenants t ON t.id = s.tenant_id"
    ).fetchall()
    return {name: tuple(rest) for name, *rest in rows}


def test_a_refresh_rewrites_only_what_changed_and_follows_the_oldest_task(conn: Conn) -> None:
    load(conn, envelopes("a", 3) + envelopes("b", 2))
    # Enqueued a second apart, in line order.
    conn.execute(
        "UPDATE rota.tasks SET enqueued_at = '2026-01-01'::timestamptz + seq * interval '1 s'"
    )
    enqueued = conn.execute(
        "SELECT t.name, k.enqueued_at FROM rota.tasks k JOIN rota.tenants t ON t.id = k.tenant_id"
        " ORDER BY k.seq"
    ).fetchall()
    a_times = [at for name, at in enqueued if name == "a"]
    b_times = [at for name, at in enqueued if name == "b"]
    db.run(conn, core.refresh_stats())
    first = _stats(conn)
    assert {k: v[:3] for k, v in first.items()} == {
        "a": (3, 0, a_times[0]),
        "b": (2, 0, b_times[0]),
    }
    counted = conn.execute("SELECT at FROM rota.stats_counted").fetchone()
    # Nothing changed: no row is rewritten (same row versions); the count's time moves on.
    db.run(conn, core.refresh_stats())
    assert conn.execute("SELECT at FROM rota.stats_counted").fetchone() != counted
    assert _stats(conn) == first
    # a's first task running, the others released: its oldest waiting is its
    # next. b's tasks done: its row goes.
    got = claim(conn, 5)
    db.transact(conn, core.complete([t.token for t in got if t.tenant == "b"]))
    db.transact(conn, core.release([t.token for t in got if t.tenant == "a"][1:]))
    db.run(conn, core.refresh_stats())
    assert {k: v[:3] for k, v in _stats(conn).items()} == {"a": (2, 1, a_times[1])}


def test_tenants_page_at_ten_thousand_tenants(conn: Conn) -> None:
    load(conn, [e for i in range(10_000) for e in envelopes(f"t{i:05d}", 1)])
    db.run(conn, core.refresh_stats())
    page = db.run(conn, read.tenants(sort="name", descending=False, offset=9_990, limit=50))
    assert page.total == 10_000 and [t.name for t in page.rows][:2] == ["t09990", "t09991"]
    assert len(page.rows) == 10


def test_lists_of_tasks_by_state(conn: Conn) -> None:
    load(conn, envelopes("a", 3, queue="q1") + envelopes("b", 2, queue="q2"))
    load(conn, envelopes("c", 1, eta=datetime.now(UTC) + timedelta(hours=1)))
    assert [t.tenant for t in db.run(conn, read.tasks("ready"))] == ["a", "b", "a", "b", "a"]
    assert len(db.run(conn, read.tasks("ready", queue="q1", limit=2))) == 2
    assert [t.tenant for t in db.run(conn, read.tasks("scheduled"))] == ["c"]
    claim(conn, 1, queues=("q2",))
    assert [t.state for t in db.run(conn, read.tasks("running"))] == ["running"]
    with pytest.raises(ValidationError):
        read.tasks("lost")


# -- why is it waiting ---------------------------------------------------------


def why(conn: Conn, settings: Settings, task_id: Any, client: Any = None) -> Any:
    return task_story(conn, client, settings, task_id)


def test_why_ready_counts_the_claimable_tasks_ahead(conn: Conn, settings: Settings) -> None:
    first = envelopes("flood", 50)
    late = envelopes("quiet", 1)
    load(conn, first + late)
    story = why(conn, settings, late[0].id)
    assert story.where == "ready"
    # Fair order: the quiet tenant's task is second in line.
    assert story.task.ahead == 1
    assert "1 claimable tasks ahead of it in queue default" in story.why
    assert "no live worker claims queue default" in story.why
    last = why(conn, settings, first[-1].id)
    assert last.task.ahead == 50


def test_why_an_urgent_task_runs_at_its_tenants_next_turn(conn: Conn, settings: Settings) -> None:
    load(conn, envelopes("flood", 50) + envelopes("quiet", 3))
    urgent = envelopes("flood", 2, priority=9)
    load(conn, urgent)
    story = why(conn, settings, urgent[0].id)
    assert story.where == "ready" and story.task.priority == 9
    assert story.task.lower_ahead == 50 and story.task.urgent_before == 0
    # Its tenant's next turn is the first in line.
    assert story.task.ahead == 0
    assert story.why.startswith(
        "ready, priority 9: runs at its tenant's next turn, ahead of 50 lower-priority task(s) "
        "of tenant flood; that turn is in line, with 0 claimable tasks ahead of it"
    )
    second = why(conn, settings, urgent[1].id)
    assert second.task.urgent_before == 1 and second.task.ahead == 2  # flood, quiet, then it
    assert "after its 1 more urgent task(s)" in second.why
    plain = why(conn, settings, envelopes_of(conn, "quiet")[0])
    assert plain.task.priority == 0 and plain.why.startswith("ready: in line, with 1 claimable")
    states = db.run(conn, core.task_states([urgent[0].id]))
    assert states[urgent[0].id].priority == 9


def envelopes_of(conn: Conn, tenant: str) -> list[Any]:
    rows = conn.execute("SELECT id FROM rota.tasks WHERE tenant = %s ORDER BY seq", [tenant])
    return [task_id for (task_id,) in rows]


def test_why_ready_estimates_a_place_deep_in_line(
    conn: Conn, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Past the exact count's cap the place comes from a sample: half of the
    # table's ~110 pages here, so the estimate is a real one, not a full
    # count; its spread is about ±10%, and the bound below is 4 of those.
    monkeypatch.setattr(stored, "AHEAD_SAMPLE_ROWS", (stored.AHEAD_CAP + 2_000) // 2)
    flood = envelopes("flood", stored.AHEAD_CAP + 2_000)
    load(conn, flood)
    conn.execute("ANALYZE rota.ready")
    counted = why(conn, settings, flood[stored.AHEAD_CAP // 2].id)
    assert counted.task.ahead == stored.AHEAD_CAP // 2 and not counted.task.ahead_estimated
    last = why(conn, settings, flood[-1].id)
    truth = len(flood) - 1
    assert last.task.ahead_estimated
    assert truth * 0.6 <= last.task.ahead <= truth * 1.4, last.task.ahead
    assert "the rest estimated from a sample" in last.why


def test_why_held_back_by_its_tenant(conn: Conn, settings: Settings) -> None:
    db.transact(conn, core.configure_tenant("capped", concurrency_limit=1))
    db.transact(conn, core.configure_tenant("slow", rate_limit=0.5, rate_burst=1))
    capped = envelopes("capped", 2)
    slow = envelopes("slow", 2)
    load(conn, capped + slow)
    claim(conn, 10)  # one of each: the limit and the token are used up
    waiting_capped = why(conn, settings, capped[1].id)
    assert "at its concurrency limit: 1 claimed of 1 (running or prefetched)" in waiting_capped.why
    waiting_slow = why(conn, settings, slow[1].id)
    assert "out of rate tokens (0.5/s): the next comes in" in waiting_slow.why
    db.run(conn, core.pause_queue("default", True, ME))
    db.run(conn, core.pause_tenant("capped", True, ME))
    paused = why(conn, settings, capped[1].id)
    assert "its queue default is paused" in paused.why
    assert "its tenant capped is paused" in paused.why


def test_why_scheduled_running_and_ended(conn: Conn, settings: Settings) -> None:
    eta = datetime.now(UTC) + timedelta(minutes=10)
    (later,) = envelopes("a", 1, eta=eta)
    (flaky,) = envelopes("b", 1, max_attempts=3, backoff_base=600)
    (doomed,) = envelopes("c", 1, max_attempts=1)
    load(conn, [later, flaky, doomed])
    scheduled = why(conn, settings, later.id)
    assert scheduled.where == "scheduled"
    assert "waits for its ETA; it is due in 9." in scheduled.why or "in 10.0 min" in scheduled.why
    running = {t.id: t for t in claim(conn, 10)}
    story = why(conn, settings, flaky.id)
    assert story.where == "running" and "on worker test-worker" in story.why
    assert "(attempt 1 of 3)" in story.why
    db.transact(conn, core.fail([core.Failure(flaky.id, 1, "ValueError: bad page")]))
    backoff = why(conn, settings, flaky.id)
    assert backoff.where == "scheduled"
    assert "retry backoff after attempt 1 of 3 failed (ValueError: bad page)" in backoff.why
    trace = "Traceback (most recent call last):\n  ...\nValueError: no"
    db.transact(
        conn,
        core.fail(
            [core.Failure(doomed.id, running[doomed.id].attempt, "ValueError: no", traceback=trace)]
        ),
    )
    dead = why(conn, settings, doomed.id)
    assert dead.where == "dead" and dead.why == "dead after attempt 1 of 1: ValueError: no"
    assert dead.task.traceback == trace
    db.run(conn, core.cancel([later.id], ME))
    cancelled = why(conn, settings, later.id)
    assert cancelled.where == "cancelled" and f"cancelled by {ME}" in cancelled.why
    assert [h[2] for h in cancelled.task.history] == ["cancel"]


def test_why_succeeded(conn: Conn, settings: Settings) -> None:
    load(conn, envelopes("a", 1))
    (task,) = claim(conn, 1)
    db.transact(conn, core.complete([task.token]))
    story = why(conn, settings, task.id)
    assert story.where == "succeeded" and story.why.startswith("succeeded ")


def test_why_still_in_the_buffer_or_its_dead_letters(
    app: App, conn: Conn, settings: Settings
) -> None:
    parse_pdf = app.tasks["parse_pdf"]
    ahead = app.enqueue_many([parse_pdf.using(tenant="alice").prepare(str(i)) for i in range(3)])
    wanted = parse_pdf.using(tenant="alice").enqueue("x")
    keyed = parse_pdf.using(tenant="alice", idempotency_key="upload-7").enqueue("y")
    client = redis.Redis.from_url(settings.redis_url)
    story = why(conn, settings, wanted, client)
    assert story.where == "buffer"
    assert "1 entries ahead of it in its shard (up to 256 tasks" in story.why  # one entry
    assert "is a loader running?" not in story.why  # fresh
    assert why(conn, settings, keyed, client).where == "buffer"  # no time in its id: scanned
    assert ahead

    from rota.loader import Loader

    strict = settings.model_copy(update={"queues": "mail"})
    loader = Loader(strict)
    loader.drain()
    loader.close()
    letter = why(conn, settings, wanted, client)
    assert letter.where == "dead-letter"
    assert "queue 'pdfs' is not in ROTA_QUEUES" in letter.why
    import uuid

    nowhere = why(conn, settings, uuid.uuid4(), client)
    assert nowhere.where == "unknown"
    assert "PostgreSQL, the buffer or its dead letters" in nowhere.why
    client.close()


def test_dead_letters_replay_and_purge(app: App, conn: Conn, settings: Settings) -> None:
    from rota.buffer import deadletters
    from rota.loader import Loader
    from rota.loader.replay import purge, replay

    parse_pdf = app.tasks["parse_pdf"]
    ids = app.enqueue_many([parse_pdf.using(tenant="alice").prepare(str(i)) for i in range(3)])
    loader = Loader(settings.model_copy(update={"queues": "mail"}))
    loader.drain()
    loader.close()
    client = redis.Redis.from_url(settings.redis_url)
    letters = deadletters.newest(client, settings.stream_prefix)
    assert len(letters) == 3 and deadletters.count(client, settings.stream_prefix) == 3
    assert all("ROTA_QUEUES" in x.reason for x in letters)
    assert sorted(i for x in letters for i in x.task_ids) == sorted(str(i) for i in ids)
    assert deadletters.get(client, settings.stream_prefix, letters[0].id) == letters[0]

    # Still refused under the same rules: it stays, with why.
    refused = replay(
        client, conn, settings.model_copy(update={"queues": "mail"}), [letters[0].id], ME
    )
    assert refused.loaded == {} and "ROTA_QUEUES" in refused.refused[letters[0].id]
    # With the queue allowed, it loads; the letter is gone.
    done = replay(client, conn, settings, [letters[0].id, "1-1"], ME)
    assert done.loaded == {letters[0].id: 1} and done.missing == ["1-1"]
    assert deadletters.count(client, settings.stream_prefix) == 2
    assert len(claim(conn, 10, queues=("pdfs",))) == 1

    assert purge(client, conn, settings.stream_prefix, ME, [letters[1].id]) == 1
    assert purge(client, conn, settings.stream_prefix, ME, everything=True) == 1
    assert deadletters.count(client, settings.stream_prefix) == 0
    assert [(r[1], r[3]) for r in audit_rows(conn)] == [("replay", 1), ("purge", 1), ("purge", 1)]
    client.close()
