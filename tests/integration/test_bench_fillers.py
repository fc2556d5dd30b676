"""The claim benchmark's queues: what it compares across backlog sizes must
differ only in depth."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
from psycopg import sql

from rota_tools.bench.claim import FifoFiller
from rota_tools.bench.harness import Filler

Conn = psycopg.Connection[Any]


def _mix(conn: Conn, queue: str) -> Counter[tuple[str, int]]:
    rows = conn.execute(
        "SELECT t.tenant, r.priority, count(*) FROM rota.ready r"
        " JOIN rota.tasks t ON t.id = r.task_id JOIN rota.queues q ON q.id = r.queue_id"
        " WHERE q.name = %s GROUP BY 1, 2",
        [queue],
    )
    return Counter({(tenant, priority): n for tenant, priority, n in rows})


def test_a_topped_up_queue_keeps_its_tenants_and_priorities(conn: Conn) -> None:
    filler = Filler(conn, tenants=10, queue="mixed", priorities=(0, 0, 0, 5, 9))
    filler.fill(400)
    before = _mix(conn, "mixed")
    assert {priority for _, priority in before} == {0, 5, 9}

    claimed = filler.claim(60)
    assert filler.finish(claimed) == 60
    # Claims take each tenant's urgent tasks first: the queue's mix moved.
    assert _mix(conn, "mixed") != before
    filler.replace(claimed)
    assert _mix(conn, "mixed") == before
    # And so on, claim after claim: the replacements' priorities are known too.
    for _ in range(5):
        claimed = filler.claim(60)
        filler.finish(claimed)
        filler.replace(claimed)
    assert _mix(conn, "mixed") == before


def test_the_priority_baseline_claims_urgent_tasks_first_and_keeps_its_mix(conn: Conn) -> None:
    fifo = FifoFiller(conn, "mixed", priorities=(0, 0, 0, 5, 9))
    try:
        fifo.fill(400)
        before = _baseline_mix(fifo)
        assert before == Counter({0: 240, 5: 80, 9: 80})

        claimed = fifo.claim(100)
        # Highest priority first.
        assert Counter(row[2] for row in claimed) == Counter({9: 80, 5: 20})
        assert fifo.finish(claimed) == 100
        fifo.replace(claimed)
        assert _baseline_mix(fifo) == before
        fifo.add(5)  # in the turn of priorities, where the fill left it
        assert _baseline_mix(fifo) == before + Counter({0: 3, 5: 1, 9: 1})
    finally:
        fifo.drop()


def test_the_leased_baseline_records_each_claim_and_its_completion(conn: Conn) -> None:
    fifo = FifoFiller(conn, "leased", leased=True)
    try:
        fifo.fill(50)
        claimed = fifo.claim(20)
        assert len(claimed) == 20
        assert _baseline_statuses(fifo) == Counter({"queued": 30, "running": 20})
        assert fifo.finish(claimed) == 20
        assert fifo.finish(claimed) == 0  # a task completes once
        assert _baseline_statuses(fifo) == Counter({"queued": 30, "done": 20})
    finally:
        fifo.drop()
    gone = conn.execute("SELECT to_regnamespace(%s)", [fifo.schema]).fetchone()
    assert gone == (None,)


def _baseline_mix(fifo: FifoFiller) -> Counter[int]:
    table = sql.Identifier(fifo.schema, "rota_bench_fifo_ready")
    rows = fifo.conn.execute(sql.SQL("SELECT priority, count(*) FROM {} GROUP BY 1").format(table))
    return Counter({priority: n for priority, n in rows})


def _baseline_statuses(fifo: FifoFiller) -> Counter[str]:
    table = sql.Identifier(fifo.schema, "rota_bench_fifo_body")
    rows = fifo.conn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY 1").format(table))
    return Counter({status: n for status, n in rows})
