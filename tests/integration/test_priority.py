"""Priority within a tenant (real PostgreSQL): a tenant's urgent task runs
ahead of its own backlog at the tenant's next turn, and the tenants' shares
are exactly what they are without priorities."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rota import core
from rota.core import db
from rota.core.work import Failure
from tests.helpers import claim, envelopes, load

Conn = psycopg.Connection[Any]
PROPERTY = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _reset(conn: Conn) -> None:
    conn.execute(
        "TRUNCATE rota.tasks, rota.ready, rota.running, rota.scheduled, rota.tenant_queues, "
        "rota.finished, rota.tenants, rota.queues RESTART IDENTITY"
    )


def _drain(conn: Conn, batch: int = 1) -> list[tuple[str, Any]]:
    """Claims and completes everything; (tenant, task id) in claim order."""
    order: list[tuple[str, Any]] = []
    while got := claim(conn, batch):
        order.extend((t.tenant, t.id) for t in got)
        db.transact(conn, core.complete(t.token for t in got))
    return order


def _priority(conn: Conn, table: str, task_id: Any) -> Any:
    column = "id" if table == "tasks" else "task_id"
    row = conn.execute(f"SELECT priority FROM rota.{table} WHERE {column} = %s", [task_id])
    found = row.fetchone()
    return found[0] if found else None


def _vtimes(conn: Conn, tenant: str) -> list[float]:
    """The tenant's places in line, waiting and running."""
    rows = conn.execute(
        "SELECT vtime FROM rota.ready r JOIN rota.tenants t ON t.id = r.tenant_id "
        "WHERE t.name = %(t)s UNION ALL SELECT vtime FROM rota.running r "
        "JOIN rota.tenants t ON t.id = r.tenant_id WHERE t.name = %(t)s ORDER BY 1",
        {"t": tenant},
    ).fetchall()
    return [v for (v,) in rows]


def test_a_tenants_urgent_task_runs_at_its_next_turn_ahead_of_its_backlog(conn: Conn) -> None:
    load(conn, envelopes("noisy", 500) + envelopes("quiet", 3))
    places = _vtimes(conn, "noisy")
    (urgent,) = envelopes("noisy", 1, priority=7)
    load(conn, [urgent])
    assert _priority(conn, "tasks", urgent.id) == _priority(conn, "ready", urgent.id) == 7
    before = _vtimes(conn, "noisy")
    got = claim(conn, 2)  # one turn each: noisy's is the urgent task's
    assert [t.tenant for t in got] == ["noisy", "quiet"]
    assert got[0].id == urgent.id
    # The tenant's places are those it had (the displaced task took the
    # urgent one's), so its share is unchanged.
    assert _vtimes(conn, "noisy") == before == sorted([*places, max(before)])
    assert _priority(conn, "running", urgent.id) == 7


def test_higher_priorities_run_first_within_a_tenant(conn: Conn) -> None:
    tasks = [
        *envelopes("a", 3),
        *envelopes("a", 2, priority=3),
        *envelopes("a", 2, priority=9),
        *envelopes("a", 1, priority=3),
    ]
    load(conn, tasks)
    priority = {t.id: t.priority for t in tasks}
    for batch in (1, 3):
        _reset(conn)
        load(conn, tasks)
        ran = [priority[task_id] for _, task_id in _drain(conn, batch)]
        # (A batch's tasks run side by side: in a batch, any order.)
        in_batches = [
            p for i in range(0, len(ran), batch) for p in sorted(ran[i : i + batch])[::-1]
        ]
        assert in_batches == [9, 9, 3, 3, 3, 0, 0, 0], batch


# A pattern: load batches of (tenant, how many, priority), each followed by a
# few claims, then a drain.
tenants = st.sampled_from([f"t{i}" for i in range(5)])
arrivals = st.lists(
    st.tuples(
        st.lists(
            st.tuples(tenants, st.integers(1, 8), st.sampled_from([0, 0, 1, 5, 9])),
            min_size=1,
            max_size=5,
        ),
        st.integers(0, 6),
    ),
    min_size=1,
    max_size=4,
)


@PROPERTY
@given(pattern=arrivals, batch=st.integers(1, 6), weights=st.lists(st.sampled_from([1, 2, 3])))
def test_shares_across_tenants_are_exactly_those_without_priorities(
    conn: Conn, pattern: Any, batch: int, weights: list[int]
) -> None:
    def run(with_priorities: bool) -> list[str]:
        _reset(conn)
        for i, weight in enumerate(weights[:5]):
            db.transact(conn, core.configure_tenant(f"t{i}", weight=weight))
        order: list[str] = []
        for arrivals, claims in pattern:
            load(
                conn,
                [
                    e
                    for tenant, n, priority in arrivals
                    for e in envelopes(tenant, n, priority=priority if with_priorities else 0)
                ],
            )
            for _ in range(claims):
                got = claim(conn, batch)
                order.extend(t.tenant for t in got)
                db.transact(conn, core.complete(t.token for t in got))
        return order + [tenant for tenant, _ in _drain(conn, batch)]

    assert run(with_priorities=True) == run(with_priorities=False)


def test_a_tenant_sending_everything_at_the_top_priority_gets_no_more_than_its_share(
    conn: Conn,
) -> None:
    load(conn, envelopes("greedy", 60, priority=9) + envelopes("plain", 30))
    first = [tenant for tenant, _ in _drain(conn, batch=4)][:60]
    assert first.count("greedy") == first.count("plain") == 30
    _reset(conn)
    # And its urgent tasks arriving over a plain backlog change nothing either.
    load(conn, envelopes("greedy", 30) + envelopes("plain", 30))
    load(conn, envelopes("greedy", 30, priority=9))
    first = [tenant for tenant, _ in _drain(conn, batch=3)][:60]
    assert first.count("greedy") == first.count("plain") == 30


def test_a_quiet_tenants_urgent_task_waits_no_longer_than_today(conn: Conn) -> None:
    # As without priorities (test_fairness_properties): a newcomer is served
    # within one round of the tenants waiting, whatever they sent at which
    # priority, and its own priority 9 changes none of that.
    for priority in (0, 9):
        _reset(conn)
        for n in range(10):
            load(conn, envelopes(f"busy{n}", 30, priority=9 if n % 2 else 0))
            load(conn, envelopes(f"busy{n}", 30, priority=n % 10))
        claim(conn, 25)
        (task,) = envelopes("quiet", 1, priority=priority)
        load(conn, [task])
        ahead = 0
        while (got := claim(conn, 1)) and got[0].id != task.id:
            ahead += 1
        assert got, priority
        assert ahead <= 10, (priority, ahead)


def test_an_urgent_task_of_a_limited_tenant_takes_an_admitted_slot_only(conn: Conn) -> None:
    db.transact(conn, core.configure_tenant("limited", concurrency_limit=2))
    load(conn, envelopes("limited", 10) + envelopes("other", 10))
    urgent = envelopes("limited", 3, priority=5)
    load(conn, urgent)
    got = claim(conn, 20)
    mine = {t.id for t in got if t.tenant == "limited"}
    assert len(mine) == 2 and mine <= {t.id for t in urgent}
    (running,) = conn.execute(
        "SELECT running FROM rota.tenants WHERE name = 'limited'"
    ).fetchone() or (None,)
    assert running == 2
    assert claim(conn, 20) == []  # the limit holds


def test_requeues_releases_and_retries_keep_the_priority(conn: Conn) -> None:
    load(conn, envelopes("a", 5))
    (task,) = envelopes("a", 1, priority=6, backoff_base=0.0)
    load(conn, [task])
    (got,) = claim(conn, 1)
    assert got.id == task.id
    place = conn.execute("SELECT vtime FROM rota.running WHERE task_id = %s", [task.id]).fetchone()
    # Released: back in line at the slot's place, with its priority.
    assert db.transact(conn, core.release([got.token])) == {task.id}
    assert conn.execute(
        "SELECT vtime, priority FROM rota.ready WHERE task_id = %s", [task.id]
    ).fetchone() == (*(place or ()), 6)
    # Expired: requeued, still urgent.
    (got,) = claim(conn, 1)
    assert got.id == task.id
    conn.execute("UPDATE rota.running SET lease_expires_at = now() - interval '1 second'")
    assert db.transact(conn, core.requeue_expired()) == {task.id}
    assert _priority(conn, "ready", task.id) == 6
    # Failed: retried through the schedule, into line again with it.
    (got,) = claim(conn, 1)
    assert got.id == task.id
    retry_at = datetime.now(UTC) - timedelta(seconds=1)
    db.transact(conn, core.fail([Failure(got.id, got.attempt, "boom", retry_at=retry_at)]))
    assert db.transact(conn, core.promote_due()) == 1
    assert _priority(conn, "ready", task.id) == 6
    (got,) = claim(conn, 1)
    assert got.id == task.id and got.attempt == 3


def test_the_database_refuses_a_priority_out_of_range(conn: Conn) -> None:
    (task,) = envelopes("a", 1)
    load(conn, [task])
    for bad in (10, -1):
        try:
            conn.execute("UPDATE rota.tasks SET priority = %s WHERE id = %s", [bad, task.id])
        except psycopg.errors.CheckViolation as exc:
            assert "priority_bounded" in str(exc)
        else:
            raise AssertionError(f"priority {bad} was stored")
