"""Fairness as properties, over arrival patterns drawn by hypothesis (real PostgreSQL)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rota import core
from rota.core import db
from tests.helpers import claim, drain_order, envelopes, load

Conn = psycopg.Connection[Any]
PROPERTY = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

tenants = st.sampled_from([f"t{i}" for i in range(8)])
# A pattern: several load batches, each a list of (tenant, how many).
arrivals = st.lists(
    st.lists(st.tuples(tenants, st.integers(1, 12)), min_size=1, max_size=6),
    min_size=1,
    max_size=4,
)


def _reset(conn: Conn) -> None:
    conn.execute(
        "TRUNCATE rota.tasks, rota.ready, rota.running, rota.scheduled, rota.tenant_queues, "
        "rota.tenants, rota.queues RESTART IDENTITY"
    )


@PROPERTY
@given(pattern=arrivals, batch=st.integers(1, 7))
def test_no_second_turn_before_everyone_waiting_had_one(
    conn: Conn, pattern: Any, batch: int
) -> None:
    _reset(conn)
    for load_batch in pattern:
        load(conn, [e for tenant, n in load_batch for e in envelopes(tenant, n)])
    order = drain_order(conn, batch=batch)
    # The k-th turn of any tenant comes before the (k+1)-th turn of any tenant.
    turns: Counter[str] = Counter()
    ordinals = []
    for tenant in order:
        turns[tenant] += 1
        ordinals.append(turns[tenant])
    assert ordinals == sorted(ordinals)


@PROPERTY
@given(
    weights=st.lists(st.sampled_from([1, 2, 3, 5]), min_size=2, max_size=4),
    extra=st.integers(0, 40),
)
def test_weighted_shares_stay_within_one_turn_of_the_weights(
    conn: Conn, weights: list[int], extra: int
) -> None:
    _reset(conn)
    names = [f"w{i}" for i in range(len(weights))]
    for name, weight in zip(names, weights, strict=True):
        db.transact(conn, core.configure_tenant(name, weight=weight))
    per_tenant = 60 + extra
    load(conn, [e for name in names for e in envelopes(name, per_tenant)])
    served: Counter[str] = Counter()
    weight_of = dict(zip(names, weights, strict=True))
    for tenant in drain_order(conn, batch=10):
        served[tenant] += 1
        backlogged = [n for n in names if served[n] < per_tenant]
        # Start-time fair queueing's bound: normalised service differs by at
        # most one task of each tenant between any two backlogged tenants.
        for a in backlogged:
            for b in backlogged:
                gap = served[a] / weight_of[a] - served[b] / weight_of[b]
                assert abs(gap) <= 1 / weight_of[a] + 1 / weight_of[b] + 1e-9


@PROPERTY
@given(
    backlog=st.lists(st.integers(5, 40), min_size=1, max_size=6),
    claimed_first=st.integers(0, 60),
)
def test_a_late_tenant_is_served_within_one_round(
    conn: Conn, backlog: list[int], claimed_first: int
) -> None:
    _reset(conn)
    load(conn, [e for i, n in enumerate(backlog) for e in envelopes(f"busy{i}", n)])
    for _ in range(claimed_first // 10):
        got = claim(conn, 10)
        db.transact(conn, core.complete(t.token for t in got))
    still_waiting = db.run(conn, core.queue_counts())["default"]["ready"]
    load(conn, envelopes("late", 1))
    order = drain_order(conn, batch=1)
    busy_with_work = len(backlog)
    assert order.index("late") <= busy_with_work if still_waiting else order == ["late"]
