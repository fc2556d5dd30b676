"""Max-min fair share over real servers: maintenance records each tenant's
demand (completions and unfinished tasks) and each queue's fair level, and
the read model owes a tenant least(demand, weight * level), the figure the
tenant chart, `rota tenant show` and /api/tenants/NAME all read; and a
succeeded task's record keeps its attempts allowed and cost."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from rota import core
from rota.core import db, history, read
from rota.core.stored import stored_task
from tests.helpers import claim, envelopes, load

Conn = psycopg.Connection[Any]


def _within_a_minute() -> None:
    """Waits until the minute has room for the test's counts (they must land
    in one minute: a demand is a minute's)."""
    while not 3 <= datetime.now(UTC).second <= 50:
        time.sleep(0.1)


def _serve(conn: Conn, limit: int) -> list[str]:
    """Claims and completes up to `limit` tasks; counts what finished."""
    got = claim(conn, limit)
    db.transact(conn, core.complete([t.token for t in got]))
    # Counted now: count_service counts up to a second ago, from where its
    # last count ended (a second before it ran, which was before this).
    conn.execute(
        "UPDATE rota.finished SET finished_at = now() - interval '1 second'"
        " WHERE task_id = ANY (%s)",
        ([t.id for t in got],),
    )
    db.run(conn, core.count_service())
    db.run(conn, core.refresh_stats())
    return [t.tenant for t in got]


def _now_point(conn: Conn, name: str) -> history.TenantPoint:
    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    points = db.run(conn, history.tenant_history([name], minute, 60))
    return next(p for p in points if p.at == minute)


def _end_the_minute(conn: Conn) -> None:
    """Moves the minute's counts a minute back: the minute has ended."""
    for table in ("rota.service", "rota.queue_history"):
        conn.execute(f"UPDATE {table} SET minute = minute - interval '1 minute'")


def test_a_trickle_is_owed_its_demand_and_more_than_its_service_when_held_back(
    conn: Conn,
) -> None:
    _within_a_minute()
    load(conn, envelopes("flood", 100) + envelopes("trickle", 3))
    served = _serve(conn, 20)
    assert served.count("trickle") == 3
    trickle, flood = _now_point(conn, "trickle"), _now_point(conn, "flood")
    # Served all it asked for while the flood took the rest: owed its demand.
    assert (trickle.completed, trickle.demand, trickle.fair_share) == (3, 3, 3)
    # The flood asked for 100 (17 served, 83 waiting): owed what is left.
    assert (flood.completed, flood.demand, flood.fair_share) == (17, 100, 17)

    # Held back by a concurrency limit of 0: its tasks wait, the flood is served.
    db.transact(conn, core.configure_tenant("trickle", concurrency_limit=0))
    load(conn, envelopes("trickle", 3))
    assert "trickle" not in _serve(conn, 10)
    trickle = _now_point(conn, "trickle")
    assert (trickle.completed, trickle.demand) == (3, 6)
    # 30 completions: the trickle's 6 fit under the level, so all are owed.
    assert trickle.fair_share == 6 and trickle.fair_share > trickle.completed

    _end_the_minute(conn)
    detail = db.run(conn, read.tenant("trickle"))
    assert detail is not None and detail.fair_minutes == history.FAIR_MINUTES
    minutes = history.FAIR_MINUTES
    assert detail.served_per_minute == 3 / minutes
    assert detail.demand_per_minute == 6 / minutes
    assert detail.fair_share_per_minute == 6 / minutes


def _rows(conn: Conn, tenant: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT v.completed, v.pending FROM rota.service v"
        " JOIN rota.tenants t ON t.id = v.tenant_id WHERE t.name = %s ORDER BY v.minute",
        (tenant,),
    ).fetchall()


def test_a_held_tenant_adds_history_only_when_its_backlog_changes(conn: Conn) -> None:
    _within_a_minute()
    db.transact(conn, core.configure_tenant("held", concurrency_limit=0))
    load(conn, envelopes("flood", 50) + envelopes("held", 4))
    _serve(conn, 10)
    assert _rows(conn, "held") == [(0, 4)]
    # Minutes pass with its backlog unchanged: no row is added, yet each
    # minute still owes it what it asks for and shows it held back.
    for _ in range(3):
        _end_the_minute(conn)
        _serve(conn, 10)
    assert _rows(conn, "held") == [(0, 4)]
    now = _now_point(conn, "held")
    assert (now.completed, now.demand, now.fair_share) == (0, 4, 4)
    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    since = minute - timedelta(minutes=3)
    points = db.run(conn, history.tenant_history(["held"], since, 60))
    assert [(p.completed, p.demand, p.fair_share) for p in points] == [(0, 4, 4)] * 4
    detail = db.run(conn, read.tenant("held"))
    assert detail is not None and detail.fair_share_per_minute is not None
    assert detail.served_per_minute == 0 < detail.fair_share_per_minute
    # A change is recorded, and an unchanged backlog again after an hour.
    load(conn, envelopes("held", 1))
    db.run(conn, core.refresh_stats())
    assert _rows(conn, "held") == [(0, 4), (0, 5)]
    conn.execute("UPDATE rota.stats SET recorded_at = recorded_at - interval '61 minutes'")
    _end_the_minute(conn)
    db.run(conn, core.refresh_stats())
    db.run(conn, core.refresh_stats())
    assert _rows(conn, "held") == [(0, 4), (0, 5), (0, 5)]
    # Its backlog gone (served once the limit lifts): one row says none is left.
    db.transact(conn, core.configure_tenant("held", concurrency_limit=None))
    _end_the_minute(conn)
    while _serve(conn, 100):
        pass
    assert _rows(conn, "held")[-1] == (5, 0)
    db.run(conn, core.refresh_stats())
    assert len(_rows(conn, "held")) == 4


def test_a_tenant_that_asked_for_nothing_is_owed_nothing(conn: Conn) -> None:
    load(conn, envelopes("busy", 2))
    db.run(conn, core.refresh_stats())
    load(conn, envelopes("idle", 1))
    detail = db.run(conn, read.tenant("idle"))
    assert detail is not None
    assert (detail.demand_per_minute, detail.fair_share_per_minute) == (0, 0)


def test_a_succeeded_tasks_record_keeps_attempts_allowed_and_cost(conn: Conn) -> None:
    load(conn, envelopes("alice", 1, max_attempts=7, cost=2.5))
    (got,) = claim(conn, 1)
    db.transact(conn, core.complete([got.token]))
    task = db.run(conn, stored_task(got.id))
    assert task is not None and task.status == "succeeded"
    assert (task.attempts, task.max_attempts, task.cost) == (1, 7, 2.5)
    # A record from before they were kept says so rather than making them up.
    conn.execute("UPDATE rota.finished SET max_attempts = NULL, cost = NULL")
    task = db.run(conn, stored_task(got.id))
    assert task is not None and (task.max_attempts, task.cost) == (None, None)


def _water_level(served: float, demands: list[float], weights: list[float]) -> float:
    """The level L at which sum(min(demand, weight * L)) == served."""
    if sum(demands) <= served:
        return float("inf")
    left, weight_left = served, sum(weights)
    for demand, weight in sorted(zip(demands, weights, strict=True), key=lambda p: p[0] / p[1]):
        if demand <= weight * (left / weight_left):
            left, weight_left = left - demand, weight_left - weight
        else:
            break
    return left / weight_left


def test_each_queues_fair_level_is_the_water_filling_level(conn: Conn) -> None:
    rng = random.Random(41)
    _within_a_minute()
    expected = {}
    for case in range(6):
        queue = f"q{case}"
        tenants = [
            (
                f"c{case}t{i}",
                rng.choice([0.5, 1.0, 2.0, 3.0]),
                rng.randint(0, 20),
                rng.randint(0, 20),
            )
            for i in range(rng.randint(2, 6))
        ]
        if case % 3 == 0:  # nothing left unfinished: every demand met
            tenants = [(name, weight, 0, completed) for name, weight, _, completed in tenants]
        # The queue exists: a task was loaded and run (not counted here).
        load(conn, envelopes(f"seed{case}", 1, queue=queue))
        db.transact(conn, core.complete([t.token for t in claim(conn, 1, queues=(queue,))]))
        for name, weight, pending, _ in tenants:
            db.transact(conn, core.configure_tenant(name, weight=weight))
            if pending:
                load(conn, envelopes(name, pending, queue=queue))
        for name, _, _, completed in tenants:
            conn.execute(
                "INSERT INTO rota.service (minute, queue_id, tenant_id, completed, wait_seconds)"
                " SELECT date_trunc('minute', now()), q.id, t.id, %s, 0"
                " FROM rota.queues q, rota.tenants t WHERE q.name = %s AND t.name = %s",
                (completed, queue, name),
            )
        served = sum(c for *_, c in tenants)
        demands = [float(p + c) for _, _, p, c in tenants]
        expected[queue] = _water_level(served, demands, [w for _, w, _, _ in tenants])
    db.run(conn, core.refresh_stats())
    levels = dict(
        conn.execute(
            "SELECT q.name, h.fair_level FROM rota.queue_history h"
            " JOIN rota.queues q ON q.id = h.queue_id WHERE h.minute = date_trunc('minute', now())"
        ).fetchall()
    )
    assert levels == pytest.approx(expected)
    assert 0 < sum(level < float("inf") for level in expected.values()) < len(expected)


def test_a_minutes_fair_level_counts_completions_counted_after_its_last_refresh(
    conn: Conn,
) -> None:
    _within_a_minute()
    load(conn, envelopes("flood", 100) + envelopes("trickle", 3))
    _serve(conn, 20)

    def level(minutes_ago: int) -> float:
        row = conn.execute(
            "SELECT h.fair_level FROM rota.queue_history h"
            " WHERE h.minute = date_trunc('minute', now()) - make_interval(mins => %s)",
            (minutes_ago,),
        ).fetchone()
        assert row is not None
        return float(row[0])

    # The trickle's 3 met, the flood owed the other 17 of 20.
    assert level(0) == 17
    _end_the_minute(conn)
    conn.execute("UPDATE rota.stats_counted SET at = at - interval '1 minute'")
    # Ten more of the flood's completions in that minute, counted late.
    conn.execute(
        "UPDATE rota.service v SET completed = completed + 10 FROM rota.tenants t"
        " WHERE t.id = v.tenant_id AND t.name = 'flood'"
    )
    db.run(conn, core.refresh_stats())
    assert level(1) == 27


def test_a_minutes_fair_level_counts_its_last_second_once_counted(conn: Conn) -> None:
    """A level computed at the minute's end lacks the completions of its
    last second (rota.count_service counts up to a second before its call):
    the refreshes of the next minute's first 2 seconds compute it again."""
    (minute,) = conn.execute(  # type: ignore[misc]
        "SELECT date_trunc('minute', now()) - interval '3 minutes'"
    ).fetchone()

    def at(seconds: float) -> datetime:
        return minute + timedelta(seconds=seconds)

    def serve(limit: int, finished: datetime) -> None:
        got = claim(conn, limit)
        db.transact(conn, core.complete([t.token for t in got]))
        conn.execute(
            "UPDATE rota.finished SET finished_at = %s WHERE task_id = ANY (%s)",
            (finished, [t.id for t in got]),
        )

    def maintain(now: datetime) -> None:
        db.run(conn, core.count_service(now))
        db.run(conn, core.refresh_stats(now))

    def level() -> float:
        row = conn.execute(
            "SELECT h.fair_level FROM rota.queue_history h WHERE h.minute = %s", (minute,)
        ).fetchone()
        assert row is not None
        return float(row[0])

    load(conn, envelopes("flood", 100) + envelopes("trickle", 3))
    serve(20, at(30))
    maintain(at(59))
    assert level() == 17  # the trickle's 3 met, the flood owed the other 17
    serve(10, at(59.5))  # the flood's, in the minute's last second
    maintain(at(60.3))  # counted up to 59.3: not yet
    assert level() == 17
    maintain(at(62.5))  # counted up to 61.5: the minute is whole
    assert level() == 27
    maintain(at(64))  # and it stays
    assert level() == 27


def test_a_task_served_in_a_minutes_last_moment_is_not_also_unfinished_at_its_end(
    conn: Conn,
) -> None:
    """A minute's unfinished tasks are those its fair level counts: a task
    recorded waiting by the minute's last refresh and served after it is
    served, not owed (the tenant stands at its fair share, not below)."""
    (minute,) = conn.execute(  # type: ignore[misc]
        "SELECT date_trunc('minute', now()) - interval '3 minutes'"
    ).fetchone()

    def at(seconds: float) -> datetime:
        return minute + timedelta(seconds=seconds)

    def maintain(now: datetime) -> None:
        db.run(conn, core.count_service(now))
        db.run(conn, core.refresh_stats(now))

    def minute_of(name: str) -> tuple[int, int, float | None]:
        row = conn.execute(
            "SELECT m.completed, m.demand, m.fair_share"
            " FROM rota.tenant_minutes(ARRAY(SELECT id FROM rota.tenants WHERE name = %s),"
            " %s, %s) m WHERE m.minute = %s",
            (name, minute, minute + timedelta(minutes=1), minute),
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), row[2]

    load(conn, envelopes("trickle", 1) + envelopes("steady", 3))
    maintain(at(30))
    got = claim(conn, 4)
    db.transact(conn, core.complete([t.token for t in got if t.tenant == "steady"]))
    conn.execute(
        "UPDATE rota.finished SET finished_at = %s WHERE task_id = ANY (%s)",
        (at(40), [t.id for t in got if t.tenant == "steady"]),
    )
    maintain(at(59))  # the minute's last refresh: the trickle's task unfinished
    assert minute_of("trickle") == (0, 1, 1.0)
    db.transact(conn, core.complete([t.token for t in got if t.tenant == "trickle"]))
    conn.execute(
        "UPDATE rota.finished SET finished_at = %s WHERE task_id = ANY (%s)",
        (at(59.5), [t.id for t in got if t.tenant == "trickle"]),
    )
    maintain(at(60.3))
    maintain(at(61.4))
    maintain(at(62.5))  # counted up to 61.5: the minute is whole
    assert minute_of("trickle") == (1, 1, 1.0)
    assert minute_of("steady") == (3, 3, 3.0)
    maintain(at(70))  # and it stays
    assert minute_of("trickle") == (1, 1, 1.0)


def test_a_queue_charged_by_time_costs_each_tenant_its_measured_seconds(
    conn: psycopg.Connection[Any],
) -> None:
    load(conn, envelopes("long", 1) + envelopes("short", 1))  # the queue and pairs exist
    claim(conn, 2)
    assert db.run(conn, core.charge_queue("default", True, "test"))
    assert not db.run(conn, core.charge_queue("nowhere", True, "test"))
    # Measured: long 100 ms a run, short 1 ms (a queue not charged records nothing).
    db.run(
        conn,
        core.record_run_times(
            {
                ("default", "long"): (20, 2.0),
                ("default", "short"): (20, 0.02),
                ("other", "x"): (1, 9.0),
            }
        ),
    )
    seconds = dict(
        conn.execute(
            "SELECT tn.name, tq.run_seconds FROM rota.tenant_queues tq "
            "JOIN rota.tenants tn ON tn.id = tq.tenant_id"
        ).fetchall()
    )
    assert seconds == pytest.approx({"long": 0.1, "short": 0.001})
    # A mean over about the last ten runs: ten more at 0.3 s move it halfway.
    db.run(conn, core.record_run_times({("default", "long"): (10, 3.0)}))
    moved = conn.execute(
        "SELECT tq.run_seconds FROM rota.tenant_queues tq JOIN rota.tenants tn "
        "ON tn.id = tq.tenant_id WHERE tn.name = 'long'"
    ).fetchone()
    assert moved == (pytest.approx(0.2),)
    db.run(conn, core.record_run_times({("default", "long"): (10, 1.0)}))  # back to 0.1 s
    # Equal weights, equal worker time: about 100 short tasks per long one.
    load(conn, envelopes("long", 50) + envelopes("short", 3000))
    order = [t.tenant for t in claim(conn, 1000)]
    assert 6 <= order.count("long") <= 14  # ~1000 / 101 by count, 50/50 by time
    # Charged by cost again: one task each per turn.
    db.run(conn, core.charge_queue("default", False, "test"))
    load(conn, envelopes("long2", 50) + envelopes("short2", 50))
    rest = [t.tenant for t in claim(conn, 5000) if t.tenant.endswith("2")]
    assert rest[:10].count("long2") == 5
