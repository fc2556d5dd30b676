"""`rota bench runtime-fairness`: two tenants both backlogged (a feeder
keeps each one's line topped up), one with 100 ms tasks and one with 1 ms
tasks; the share of worker time each gets, counted over a window after a
warm-up, in a queue charged by measured time (equal weights, then 2:1) and,
for comparison, by declared cost (task-count fairness)."""

from __future__ import annotations

import os
import statistics
import time
from datetime import UTC, datetime
from typing import Any

import psycopg

from rota import Settings, core
from rota.core import db
from rota.model.envelope import make_envelope
from rota_tools.bench.harness import QUEUE, in_background, reset, workers
from rota_tools.sql import query

LONG, SHORT = "long", "short"
MILLISECONDS = {LONG: 100.0, SHORT: 1.0}
# Kept waiting: enough for the slots the tenant could get before the next top-up.
TOPPED_UP = {LONG: 20, SHORT: 400}
SLOTS = 4
WARM_UP_SECONDS, WINDOW_SECONDS = 5.0, 15.0


def _feed(conn: psycopg.Connection[Any]) -> None:
    """Tops each tenant's line up to TOPPED_UP."""
    waiting = dict(conn.execute(query("bench_waiting_of")).fetchall())
    batch = [
        make_envelope(name="sleep_ms", queue=QUEUE, tenant=tenant, args=[MILLISECONDS[tenant]])
        for tenant, target in TOPPED_UP.items()
        for _ in range(max(0, target - int(waiting.get(tenant, 0))))
    ]
    if batch:
        db.transact(conn, core.load(batch))


def _shares(
    conn: psycopg.Connection[Any], settings: Settings, charge_time: bool, long_weight: float
) -> dict[str, float]:
    """Each tenant's share of the worker time in the window."""
    reset(conn)
    db.transact(conn, core.load([make_envelope(name="noop", queue=QUEUE, tenant="setup")]))
    db.run(conn, core.charge_queue(QUEUE, charge_time, "bench"))
    db.transact(conn, core.configure_tenant(LONG, weight=long_weight))
    feed = in_background(lambda: db.connect(settings.database_url), _feed, 0.05)
    with feed, workers(settings, 1, concurrency=SLOTS, batch_size=SLOTS):
        time.sleep(WARM_UP_SECONDS)  # the windows' clock, not a wait on a condition
        since = datetime.now(UTC)
        time.sleep(WINDOW_SECONDS)
        until = datetime.now(UTC)
    # Worker time: the runs that ended in the window, each its task's length
    # (a run's recorded start is its claim, which prefetching puts earlier).
    ran = dict(conn.execute(query("bench_runs_of"), {"since": since, "until": until}))
    used = {t: int(ran.get(t, 0)) * MILLISECONDS[t] for t in MILLISECONDS}
    total = sum(used.values()) or 1.0
    return {t: used[t] / total for t in MILLISECONDS}


def bench_runtime_fairness(settings: Settings, runs: int) -> dict[str, Any]:
    # Run times reach PostgreSQL with each heartbeat.
    os.environ["ROTA_HEARTBEAT_SECONDS"] = "1"
    equal, weighted, counted = [], [], []
    with db.connect(settings.database_url) as conn:
        for _ in range(runs):
            equal.append(_shares(conn, settings, True, 1.0)[LONG])
            weighted.append(_shares(conn, settings, True, 2.0)[LONG])
            counted.append(_shares(conn, settings, False, 1.0)[LONG])
    return {
        "params": {
            "milliseconds": MILLISECONDS,
            "slots": SLOTS,
            "warm_up_seconds": WARM_UP_SECONDS,
            "window_seconds": WINDOW_SECONDS,
            "runs": runs,
        },
        "equal_weights_share_of_long": round(statistics.median(equal), 3),
        "weights_2_to_1_share_of_heavier": round(statistics.median(weighted), 3),
        "task_count_share_of_long": round(statistics.median(counted), 3),
        "runs_detail": {
            "equal_weights_share_of_long": [round(x, 3) for x in equal],
            "weights_2_to_1_share_of_heavier": [round(x, 3) for x in weighted],
            "task_count_share_of_long": [round(x, 3) for x in counted],
        },
        "goal": {
            "equal_weights_share_of_long": "0.5 ± 0.05",
            "weights_2_to_1_share_of_heavier": "0.67 ± 0.05",
        },
    }
