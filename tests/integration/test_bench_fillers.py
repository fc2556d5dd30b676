"""The claim benchmark's queues: what it compares across backlog sizes must
differ only in depth."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg

from rota_tools.bench.core import Filler

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
