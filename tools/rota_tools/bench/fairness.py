"""Fairness scenarios: the same workload through rota's claim and through the
two baselines of the Hatchet post, on the same PostgreSQL.

- fifo: a narrow table claimed in arrival order with SKIP LOCKED;
- partition-by: the claim that ranks each tenant's tasks with
  `row_number() OVER (PARTITION BY tenant)` at claim time.

Waits are counted in claims ("how many tasks went first"), which the machine's
noise cannot blur; claim latency is timed.

Scenarios:
  noisy-neighbour  one tenant floods, 20 quiet tenants have a few tasks each
  zipf             1,000 tenants, demand following a Zipf law
  weighted         three tenants, weights 2:1:1
  cost             tasks of cost 1 and 10 from two tenants
"""

from __future__ import annotations

import random
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from rota import core
from rota.core import db
from rota.model.envelope import make_envelope
from rota_tools.bench.harness import load, reset
from rota_tools.sql import query

QUEUE = "fair"
CLAIM = 100


@dataclass
class Workload:
    arrivals: list[tuple[str, float]]  # (tenant, cost) in arrival order
    weights: dict[str, float] = field(default_factory=dict)
    quiet: set[str] = field(default_factory=set)


def noisy_neighbour(scale: int) -> Workload:
    quiet = {f"quiet{i:02d}" for i in range(20)}
    arrivals = [("flood", 1.0)] * (50 * scale)
    arrivals += [(t, 1.0) for _ in range(3) for t in sorted(quiet)]
    return Workload(arrivals, quiet=quiet)


def zipf(scale: int) -> Workload:
    rng = random.Random(42)
    tenants = [f"z{i:04d}" for i in range(1000)]
    weights = [1 / (rank + 1) for rank in range(len(tenants))]
    arrivals = [(t, 1.0) for t in rng.choices(tenants, weights, k=100 * scale)]
    return Workload(arrivals, quiet=set(tenants[100:]))


def weighted(scale: int) -> Workload:
    arrivals = [(t, 1.0) for _ in range(20 * scale) for t in ("gold", "silver", "bronze")]
    return Workload(arrivals, weights={"gold": 2.0, "silver": 1.0, "bronze": 1.0})


def cost(scale: int) -> Workload:
    arrivals = [("big", 10.0)] * (5 * scale) + [("small", 1.0)] * (50 * scale)
    return Workload(arrivals, quiet={"small"})


SCENARIOS: dict[str, Callable[[int], Workload]] = {
    "noisy-neighbour": noisy_neighbour,
    "zipf": zipf,
    "weighted": weighted,
    "cost": cost,
}


def _rota_order(conn: psycopg.Connection[Any], work: Workload) -> tuple[list[str], list[float]]:
    reset(conn)
    for tenant, weight in work.weights.items():
        db.transact(conn, core.configure_tenant(tenant, weight=weight))
    envelopes = [
        make_envelope(name="bench.noop", queue=QUEUE, tenant=t, cost=c) for t, c in work.arrivals
    ]
    load(conn, envelopes)
    order: list[str] = []
    latencies: list[float] = []
    while True:
        started = time.perf_counter()
        got = db.run(conn, core.claim([QUEUE], CLAIM, "bench"))
        latencies.append((time.perf_counter() - started) * 1000)
        if not got:
            return order, latencies
        order += [t.tenant for t in got]
        db.run(conn, core.complete(t.token for t in got))


def _baseline_order(
    conn: psycopg.Connection[Any], work: Workload, kind: str
) -> tuple[list[str], list[float]]:
    conn.execute(query("bench_fair_setup"))
    with conn.cursor() as cur, cur.copy(query("bench_fair_copy")) as copy:
        for tenant, _ in work.arrivals:
            copy.write_row((tenant,))
    conn.execute(query("bench_analyze_fair"))
    claim = query("bench_fifo_tenant_claim") if kind == "fifo" else query("bench_partition_claim")
    order: list[str] = []
    latencies: list[float] = []
    while True:
        started = time.perf_counter()
        rows = conn.execute(claim, {"limit": CLAIM}).fetchall()
        latencies.append((time.perf_counter() - started) * 1000)
        if not rows:
            break
        order += [r[0] for r in rows]
    conn.execute(query("bench_fair_teardown"))
    return order, latencies


def _water_fill(
    demand: dict[str, float], weights: dict[str, float], capacity: float
) -> dict[str, float]:
    """Weighted max-min fair allocation of `capacity` over `demand`."""
    allocation = dict.fromkeys(demand, 0.0)
    open_tenants = set(demand)
    while open_tenants and capacity > 1e-9:
        share = capacity / sum(weights[t] for t in open_tenants)
        satisfied = {t for t in open_tenants if demand[t] - allocation[t] <= share * weights[t]}
        if not satisfied:
            for t in open_tenants:
                allocation[t] += share * weights[t]
            break
        for t in satisfied:
            capacity -= demand[t] - allocation[t]
            allocation[t] = demand[t]
        open_tenants -= satisfied
    return allocation


def _figures(order: list[str], latencies: list[float], work: Workload) -> dict[str, Any]:
    position: dict[str, list[int]] = defaultdict(list)
    for i, tenant in enumerate(order):
        position[tenant].append(i)
    quiet = [p for t in work.quiet for p in position[t]]
    demand = Counter(t for t, _ in work.arrivals)
    # Jain's index of each tenant's service in the first half of the run (in
    # cost units) relative to its fair allocation of that service: weighted
    # max-min fairness over the tenants' demands (water-filling).
    window = order[: len(order) // 2]
    cost_of = {t: c for t, c in work.arrivals}
    served: Counter[str] = Counter()
    for tenant in window:
        served[tenant] += int(cost_of[tenant])
    weights = {t: work.weights.get(t, 1.0) for t in demand}
    fair = _water_fill(
        {t: demand[t] * cost_of[t] for t in demand}, weights, float(sum(served.values()))
    )
    ratios = [served[t] / fair[t] for t in demand if fair[t] > 0]
    jain = sum(ratios) ** 2 / (len(ratios) * sum(r * r for r in ratios)) if ratios else 1.0
    figures: dict[str, Any] = {
        "claims_before_quiet_task_p50": statistics.median(quiet) if quiet else None,
        "claims_before_quiet_task_p99": sorted(quiet)[int(0.99 * (len(quiet) - 1))]
        if quiet
        else None,
        "jain_index_first_half": round(jain, 4),
        "claim_latency_ms_p50": round(statistics.median(latencies), 3),
    }
    if work.weights:
        first = Counter(order[: len(order) // 2])
        figures["shares_first_half"] = {
            t: round(first[t] / max(1, len(order) // 2), 3) for t in sorted(work.weights)
        }
        figures["weights"] = work.weights
    return figures


def bench_fairness(url: str, scenario: str, scale: int) -> dict[str, Any]:
    work = SCENARIOS[scenario](scale)
    results: dict[str, Any] = {}
    with db.connect(url) as conn:
        results["rota"] = _figures(*_rota_order(conn, work), work)
        for kind in ("fifo", "partition-by"):
            results[kind] = _figures(*_baseline_order(conn, work, kind), work)
    rota_wait = results["rota"]["claims_before_quiet_task_p50"]
    ratios = {}
    if work.quiet and scenario == "noisy-neighbour":
        # The quiet tenants' wait under the flood relative to their wait alone.
        alone = Workload(
            [(t, c) for t, c in work.arrivals if t in work.quiet], work.weights, work.quiet
        )
        with db.connect(url) as conn:
            alone_wait = _figures(*_rota_order(conn, alone), alone)["claims_before_quiet_task_p50"]
        results["rota_quiet_alone"] = {"claims_before_quiet_task_p50": alone_wait}
        ratios["quiet_wait_flood_vs_alone"] = round(rota_wait / alone_wait, 3)
    for kind in ("fifo", "partition-by"):
        other = results[kind]["claims_before_quiet_task_p50"]
        if rota_wait is not None and other:
            ratios[f"quiet_wait_vs_{kind}"] = round(rota_wait / other, 4)
        ratios[f"claim_latency_vs_{kind}"] = round(
            results["rota"]["claim_latency_ms_p50"] / results[kind]["claim_latency_ms_p50"], 3
        )
    return {
        "params": {
            "scenario": scenario,
            "scale": scale,
            "tasks": len(work.arrivals),
            "claim_size": CLAIM,
        },
        "results": results,
        "ratios": ratios,
    }
