"""Limits on keys other than the tenant (real PostgreSQL): a key's
concurrency and rate hold over every tenant; tasks waiting on a key are
parked out of line and hold up no one; they come back at their places when
the key has room; a limit set, reset or dropped later applies to tasks
already loaded; the app makes each run's key, its workers declare limits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from rota import App, Limit, Settings, ValidationError, core
from rota.core import db
from rota.loader import Loader
from tests.helpers import claim, envelopes, load

Conn = psycopg.Connection[Any]


def _set(conn: Conn, limit: Limit, actor: str = "test") -> None:
    db.transact(conn, core.set_limit(limit, actor))


def _keys(conn: Conn) -> dict[str, tuple[int, int]]:
    """Each key's (running, parked) counters."""
    rows = conn.execute("SELECT name, running, parked FROM rota.keys").fetchall()
    return {name: (running, parked) for name, running, parked in rows}


def _parked(conn: Conn) -> int:
    return int(conn.execute("SELECT count(*) FROM rota.parked").fetchone()[0])


def _complete(conn: Conn, tasks: list[core.ClaimedTask]) -> None:
    assert db.transact(conn, core.complete(t.token for t in tasks)) == {t.id for t in tasks}


def test_a_keys_concurrency_holds_over_every_tenant(conn: Conn) -> None:
    _set(conn, Limit("stripe", concurrency=2))
    load(conn, [e for t in "abc" for e in envelopes(t, 4, limit_key="stripe")])
    got = claim(conn, 100)
    assert len(got) == 2  # two tenants' first turns; the rest are parked
    assert _keys(conn) == {"stripe": (2, 10)}
    assert _parked(conn) == 10
    assert claim(conn, 100) == []  # nothing of the key has room
    _complete(conn, got[:1])
    # A claim brings one parked task back at its place (ahead of the line),
    # the next claim takes it.
    assert claim(conn, 100) == []
    assert _keys(conn) == {"stripe": (1, 9)}
    (again,) = claim(conn, 100)
    assert _keys(conn) == {"stripe": (2, 9)}
    _complete(conn, [got[1], again])
    ran = 3
    while ran < 12:
        claim(conn, 100)  # brings back what has room
        batch = claim(conn, 100)
        assert 1 <= len(batch) <= 2
        _complete(conn, batch)
        ran += len(batch)
    assert _keys(conn) == {"stripe": (0, 0)}
    assert conn.execute("SELECT count(*) FROM rota.finished").fetchone() == (12,)


def test_tasks_waiting_on_a_key_hold_up_no_other_task(conn: Conn) -> None:
    """A saturated key's backlog, in line with everyone's, is parked by the
    claims that meet it: every claim takes a batch of the other tasks, and
    none meets a parked task again."""
    _set(conn, Limit("slow", concurrency=1))
    load(conn, envelopes("big", 1000, limit_key="slow"))
    load(conn, [e for t in range(10) for e in envelopes(f"t{t}", 20)])
    seen: set[Any] = set()
    claims, taken = 0, 0
    while taken < 200:
        batch = claim(conn, 50)
        claims += 1
        others = sum(t.tenant != "big" for t in batch)
        assert others >= min(40, 200 - taken)  # the big tenant has one turn in 11
        taken += others
        parked = {row[0] for row in conn.execute("SELECT task_id FROM rota.parked")}
        assert not parked & {t.id for t in batch}
        seen |= parked
    assert claims == 5
    assert len(seen) == _parked(conn) >= 15  # each parked once, and still parked


def _key_admissions(conn: Conn, limit: int) -> tuple[int, int]:
    """One claim in a transaction of its own: the tasks it took, and how many
    times it called rota.key_admit (the backend's function statistics not
    yet reported, which a transaction's end may report: read on both sides
    of the claim, in the transaction)."""

    def calls() -> int:
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
            " WHERE schemaname = 'rota' AND funcname = 'key_admit'"
        ).fetchone()
        assert row is not None
        return int(row[0])

    with conn.transaction():
        conn.execute("SET LOCAL track_functions = 'all'")
        before = calls()
        got = db.run(conn, core.claim(["default"], limit, "test-worker", 60.0))
        return len(got), calls() - before


def test_a_batch_naming_no_key_skips_the_keys_while_none_has_room(conn: Conn) -> None:
    """Beside a saturated key's parked backlog, a claim of unkeyed tasks
    leaves the keys alone; once the key has room, a claim brings the parked
    tasks back, whatever its batch holds."""
    _set(conn, Limit("slow", concurrency=1))
    load(conn, envelopes("big", 50, limit_key="slow"))
    held = claim(conn, 100)
    assert len(held) == 1 and _parked(conn) == 49
    load(conn, [e for t in range(5) for e in envelopes(f"t{t}", 20)])
    assert _key_admissions(conn, 10) == (10, 0)
    _complete(conn, held)
    assert _key_admissions(conn, 10) == (10, 1)  # brings one parked task back
    assert _keys(conn) == {"slow": (0, 48)}
    taken, calls = _key_admissions(conn, 100)
    assert (taken, calls) == (81, 1)  # the task back, with everyone's
    assert _keys(conn) == {"slow": (1, 48)}


def test_urgent_keyed_tasks_take_their_tenants_slots_within_the_keys_limit(conn: Conn) -> None:
    """A tenant's urgent tasks take its slots (the claim's priority step) and
    then its key's room (the key stage), in the one statement."""
    _set(conn, Limit("api", concurrency=2))
    load(conn, envelopes("a", 5, limit_key="api") + envelopes("b", 4))
    urgent = envelopes("a", 3, limit_key="api", priority=5)
    load(conn, urgent)
    got = claim(conn, 3)  # the fair order's first three: a, b, a; a's two slots go to urgent ones
    assert sorted(t.tenant for t in got) == ["a", "a", "b"]
    assert {t.id for t in got if t.tenant == "a"} <= {e.id for e in urgent}
    assert _keys(conn) == {"api": (2, 0)}
    more = claim(conn, 100)  # the key is full: a's tasks are parked, b's run
    assert {t.tenant for t in more} == {"b"} and len(more) == 3
    assert _keys(conn) == {"api": (2, 6)}


def test_a_rate_limit_on_a_key_spends_tokens_over_every_tenant(conn: Conn) -> None:
    _set(conn, Limit("sms", rate=2, burst=3))
    load(conn, [e for t in "ab" for e in envelopes(t, 5, limit_key="sms")])
    assert len(claim(conn, 100)) == 3  # the burst
    assert claim(conn, 100) == []
    # Two seconds later the bucket holds 4 tokens again, up to the burst of 3.
    conn.execute("UPDATE rota.keys SET refilled_at = refilled_at - interval '2 seconds'")
    claim(conn, 100)  # brings back as many as there are tokens
    assert len(claim(conn, 100)) == 3
    assert _parked(conn) + int(conn.execute("SELECT count(*) FROM rota.ready").fetchone()[0]) == 4


def test_a_limit_per_value_counts_each_key_apart(conn: Conn) -> None:
    _set(conn, Limit("reports", concurrency=1, per="{tenant}"))
    load(conn, [e for t in "abc" for e in envelopes(t, 3, limit_key=f"reports/{t}")])
    got = claim(conn, 100)
    assert sorted(t.tenant for t in got) == ["a", "b", "c"]
    assert _keys(conn) == {f"reports/{t}": (1, 2) for t in "abc"}


def test_a_limit_set_later_holds_for_the_tasks_already_loaded_and_running(conn: Conn) -> None:
    load(conn, envelopes("a", 6, limit_key="mail"))
    running = claim(conn, 2)  # no limit yet: they run unlimited
    assert len(running) == 2
    _set(conn, Limit("mail", concurrency=2))
    assert _keys(conn) == {"mail": (2, 0)}  # the running ones counted
    assert claim(conn, 100) == []
    _complete(conn, running)
    assert _keys(conn) == {"mail": (0, 4)}
    claim(conn, 100)
    assert len(claim(conn, 100)) == 2


def test_dropping_a_limit_puts_its_parked_tasks_back_in_line(conn: Conn) -> None:
    _set(conn, Limit("mail", concurrency=1))
    load(conn, envelopes("a", 5, limit_key="mail"))
    running = claim(conn, 100)
    assert len(running) == 1 and _parked(conn) == 4
    assert db.transact(conn, core.drop_limit("mail", "test")) is True
    assert _parked(conn) == 0
    assert len(claim(conn, 100)) == 4  # unlimited now
    _complete(conn, running)  # its counter is gone with the limit: nothing to uncount
    assert db.transact(conn, core.drop_limit("mail", "test")) is False
    assert conn.execute("SELECT key_limited FROM rota.queues").fetchone() == (False,)


def test_a_parked_tasks_story_says_what_it_waits_for(conn: Conn, settings: Settings) -> None:
    from rota.readmodel.story import task_story

    _set(conn, Limit("mail", concurrency=1))
    load(conn, envelopes("a", 2, limit_key="mail"))
    (running,) = claim(conn, 100)
    (parked,) = [row[0] for row in conn.execute("SELECT task_id FROM rota.parked")]
    story = task_story(conn, None, settings, parked)
    assert story.why.startswith("waiting for room under key mail (1 claimed of 1)")
    assert "running on worker" in task_story(conn, None, settings, running.id).why
    usage = {u.name: u for u in db.run(conn, core.limits())}
    assert (usage["mail"].running, usage["mail"].parked, usage["mail"].keys) == (1, 1, 1)


def test_cancelling_a_parked_task_takes_it_out_of_the_key(conn: Conn) -> None:
    _set(conn, Limit("mail", concurrency=1))
    load(conn, envelopes("a", 3, limit_key="mail"))
    (running,) = claim(conn, 100)
    parked = [row[0] for row in conn.execute("SELECT task_id FROM rota.parked ORDER BY vtime")]
    outcome = db.transact(conn, core.cancel([parked[0]], "test"))
    assert outcome == {parked[0]: "cancelled"}
    _complete(conn, [running])
    claim(conn, 100)
    (last,) = claim(conn, 100)
    assert last.id == parked[1]
    assert _parked(conn) == 0


def test_an_operators_setting_holds_over_declarations_until_reset(conn: Conn) -> None:
    declared = [Limit("api", concurrency=5), Limit("free")]  # "free": an operator's to set
    assert db.transact(conn, core.declare_limits(declared, "worker w1")) == ["api"]
    assert db.transact(conn, core.declare_limits(declared, "worker w2")) == []  # unchanged
    _set(conn, Limit("api", concurrency=1), "ops")
    assert db.transact(conn, core.declare_limits(declared, "worker w3")) == []
    (api,) = [u for u in db.run(conn, core.limits()) if u.name == "api"]
    assert (api.concurrency, api.declared) == (1, False)
    assert db.transact(conn, core.reset_limit("api")) is True
    assert db.transact(conn, core.declare_limits(declared, "worker w4")) == ["api"]
    (api,) = db.run(conn, core.limits())
    assert (api.concurrency, api.declared) == (5, True)
    assert db.transact(conn, core.reset_limit("nope")) is False


@pytest.fixture
def keyed(settings: Settings) -> Iterator[App]:
    app = App(settings)

    @app.task(limit=Limit("stripe", concurrency=3))
    def charge(customer: str, cents: int) -> None:
        """A call to a downstream API that every tenant shares."""

    @app.task(limit=Limit("per-customer", per="{tenant}:{customer}", concurrency=1))
    def refund(customer: str, cents: int = 0) -> None:
        """One refund at a time per (tenant, customer)."""

    yield app
    app.close()


def test_the_app_makes_each_runs_key_from_its_tenant_and_arguments(keyed: App, conn: Conn) -> None:
    """Through the buffer and the loader, and straight into PostgreSQL in the
    caller's transaction: each run stored with its key."""
    charge, refund = keyed.tasks["charge"], keyed.tasks["refund"]
    ids = [
        charge.using(tenant="acme").enqueue("c1", 100),
        refund.using(tenant="acme").enqueue("c1"),
        refund.using(tenant="acme").enqueue(customer="c2", cents=5),
        keyed.enqueue_many([refund.using(tenant="beta").prepare("c1")])[0],
    ]
    loader = Loader(keyed.settings)
    try:
        assert loader.drain().drained
    finally:
        loader.close()
    with psycopg.connect(keyed.settings.database_url) as tx:
        ids.append(refund.using(tenant="beta", connection=tx).enqueue("c9"))
    rows = dict(
        conn.execute("SELECT id, limit_key FROM rota.tasks WHERE id = ANY (%s)", [ids]).fetchall()
    )
    assert [rows[i] for i in ids] == [
        "stripe",
        "per-customer/acme:c1",
        "per-customer/acme:c2",
        "per-customer/beta:c1",
        "per-customer/beta:c9",
    ]


def test_a_limits_template_must_name_what_the_task_has(settings: Settings) -> None:
    app = App(settings)
    with pytest.raises(ValidationError, match="'region'"):

        @app.task(limit=Limit("geo", per="{region}", concurrency=1))
        def locate(city: str) -> None: ...

    with pytest.raises(ValidationError, match="burst= needs rate="):
        Limit("x", burst=3)
    with pytest.raises(ValidationError, match="limit name"):
        Limit("Stripe")
    app.close()
