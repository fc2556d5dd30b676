"""Tenants spread over several PostgreSQL primaries, simulated before rota
routes by tenant (docs/explanation/scaling.md, "Sharding tenants").

Each tenant lives on one shard (rendezvous hashing of its name). The same
workload runs on 1, 2 and 3 local PostgreSQL instances; a claimer picks the
shard it claims from next by one of three policies:

- backlog: at random, in proportion to each shard's ready tasks;
- head: the shard whose next task has the smallest start tag (a merge of the
  shards' fair orders; tags are comparable since every shard counts rounds);
- synced-head: as head, and before a load the loader lifts an idle shard's
  virtual clock to the smallest head of the busy ones (a shared clock);
  run again with claims of 10 tasks instead of 100, to show what the bound
  owes to the claim's size.

Figures, counted in claims so that the machine's noise cannot blur them:
where each task started against where one primary started it (the fairness
bound kept), the quiet tenants' waits, and the late heavy tenant's share.
Throughput is timed separately: claimer processes, each merging every shard
by head, claim and complete a preloaded backlog.
"""

from __future__ import annotations

import hashlib
import random
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from rota import core
from rota.core import db
from rota.model.envelope import TaskEnvelope, make_envelope
from rota_tools.bench.harness import reset, warm_pool
from rota_tools.sql import query
from rota_tools.stats import percentile

QUEUE = "sharded"
CLAIM = 100
SMALL_CLAIM = 10
POLICIES = ("backlog", "head", "synced-head")
Conn = psycopg.Connection[Any]


def shard_of(tenant: str, shards: int) -> int:
    """Rendezvous hashing: a tenant's shard; adding a shard moves only the
    tenants the new shard wins (about 1/n of them)."""
    return max(
        range(shards),
        key=lambda s: hashlib.blake2b(f"{s}/{tenant}".encode(), digest_size=8).digest(),
    )


@dataclass
class Workload:
    first: list[str]  # tenants of the tasks there at the start, in arrival order
    late: list[str]  # arriving once `late_after` tasks have been claimed
    late_after: int
    quiet: set[str]
    heavy_late: str


def workload(scale: int) -> Workload:
    """A flood, ten steady tenants, then a second heavy tenant and twenty
    quiet ones arriving mid-run."""
    steady = [f"steady{i:02d}" for i in range(10)]
    first = ["flood"] * (40 * scale) + [t for _ in range(4 * scale) for t in steady]
    quiet = [f"quiet{i:02d}" for i in range(20)]
    late = ["late"] * (10 * scale) + [t for _ in range(3) for t in quiet]
    # They arrive once the steady tenants are done: shards without the flood
    # are idle then, and their virtual clocks stand where they stopped.
    return Workload(first, late, 3 * len(first) // 4, set(quiet), "late")


class Shards:
    """One connection per shard, a policy to choose the next one to claim from."""

    def __init__(
        self, conns: Sequence[Conn], policy: str, seed: int = 7, claim_size: int = CLAIM
    ) -> None:
        self.conns = list(conns)
        self.policy = policy
        self.rng = random.Random(seed)
        self.claim_size = claim_size

    def load(self, tenants: Sequence[str]) -> None:
        by_shard: dict[int, list[TaskEnvelope]] = defaultdict(list)
        for tenant in tenants:
            envelope = make_envelope(name="bench.noop", queue=QUEUE, tenant=tenant)
            by_shard[shard_of(tenant, len(self.conns))].append(envelope)
        if self.policy == "synced-head":
            heads = [h for h in self.heads() if h is not None]
            if heads:
                for conn in self.conns:
                    conn.execute(query("bench_shard_floor"), {"queue": QUEUE, "floor": min(heads)})
        for shard, envelopes in by_shard.items():
            for i in range(0, len(envelopes), 10_000):
                db.transact(self.conns[shard], core.load(envelopes[i : i + 10_000]))

    def heads(self) -> list[float | None]:
        return [_value(conn, query("bench_shard_head")) for conn in self.conns]

    def pick(self) -> int | None:
        """The shard to claim from next (None: nothing waits anywhere)."""
        if self.policy == "backlog":
            backlog = [int(_value(conn, query("bench_shard_backlog")) or 0) for conn in self.conns]
            if not any(backlog):
                return None
            return self.rng.choices(range(len(self.conns)), weights=backlog)[0]
        heads = [(h, s) for s, h in enumerate(self.heads()) if h is not None]
        return min(heads)[1] if heads else None

    def claim(self, shard: int, worker: str) -> list[str]:
        conn = self.conns[shard]
        got = db.run(conn, core.claim([QUEUE], self.claim_size, worker))
        db.run(conn, core.complete(t.token for t in got))
        return [t.tenant for t in got]


def _value(conn: Conn, statement: str) -> Any:
    row = conn.execute(statement, {"queue": QUEUE}).fetchone()
    return row[0] if row else None


def _prepare(conns: Sequence[Conn]) -> None:
    for conn in conns:
        reset(conn)
        conn.execute(query("bench_shard_queue"), {"queue": QUEUE})


def _order(
    conns: Sequence[Conn], policy: str, work: Workload, claim_size: int = CLAIM
) -> list[str]:
    """The tenants in the order one claimer started their tasks."""
    _prepare(conns)
    shards = Shards(conns, policy, claim_size=claim_size)
    shards.load(work.first)
    order: list[str] = []
    late_loaded = False
    while True:
        if not late_loaded and len(order) >= work.late_after:
            shards.load(work.late)
            late_loaded = True
        shard = shards.pick()
        if shard is None:
            return order
        order += shards.claim(shard, "bench")


def _positions(order: Sequence[str]) -> dict[tuple[str, int], int]:
    """Where each tenant's k-th task started."""
    seen: Counter[str] = Counter()
    positions = {}
    for i, tenant in enumerate(order):
        positions[(tenant, seen[tenant])] = i
        seen[tenant] += 1
    return positions


def _figures(order: list[str], reference: list[str], work: Workload) -> dict[str, Any]:
    here, there = _positions(order), _positions(reference)
    moved = sorted(abs(here[key] - there[key]) for key in there)
    quiet = [i - work.late_after for i, t in enumerate(order) if t in work.quiet]
    # The late heavy tenant's share of the claims while it had work, against
    # its fair share (one of the tenants with work then, as on one primary).
    late = [i for i, t in enumerate(order) if t == work.heavy_late]
    window = order[late[0] : late[-1] + 1] if late else []
    return {
        "tasks": len(order),
        "displacement_vs_one_primary": {
            "max": moved[-1],
            "p99": percentile([float(m) for m in moved], 0.99),
            "p50": statistics.median(moved),
        },
        "claims_before_quiet_task": {
            "p50": statistics.median(quiet),
            "p99": percentile([float(q) for q in quiet], 0.99),
        },
        "late_heavy_tenant_first_100_share": round(
            Counter(order[late[0] : late[0] + 100])[work.heavy_late] / 100, 3
        )
        if late
        else None,
        "late_heavy_tenant_span": len(window),
    }


def _claimer(args: tuple[list[str], int]) -> int:
    urls, seed = args
    done = 0
    conns = [db.connect(url, synchronous_commit=False) for url in urls]
    try:
        shards = Shards(conns, "head", seed)
        while (shard := shards.pick()) is not None:
            done += len(shards.claim(shard, f"bench-{seed}"))
    finally:
        for conn in conns:
            conn.close()
    return done


def _throughput(urls: list[str], tasks: int, tenants: int, claimers: int) -> float:
    with_conns = [db.connect(url) for url in urls]
    try:
        _prepare(with_conns)
        Shards(with_conns, "head").load([f"t{i % tenants:04d}" for i in range(tasks)])
    finally:
        for conn in with_conns:
            conn.close()
    with warm_pool(claimers) as pool:
        started = time.perf_counter()
        done = sum(pool.map(_claimer, [(urls, seed) for seed in range(claimers)]))
        elapsed = time.perf_counter() - started
    assert done == tasks, (done, tasks)
    return done / elapsed


def bench_shards(
    urls: list[str], scale: int, tasks: int, tenants: int, claimers: int
) -> dict[str, Any]:
    """The simulation on the first 1, 2, ... of `urls` (PostgreSQL instances)."""
    work = workload(scale)
    results: dict[str, Any] = {}
    reference: list[str] = []
    for n in range(1, len(urls) + 1):
        conns = [db.connect(url, synchronous_commit=False) for url in urls[:n]]
        try:
            spread = Counter(shard_of(t, n) for t in set(work.first + work.late))
            entry: dict[str, Any] = {"tenants_per_shard": [spread[s] for s in range(n)]}
            for policy in POLICIES if n > 1 else ("head",):
                order = _order(conns, policy, work)
                if n == 1:
                    reference = order
                entry[policy] = _figures(order, reference, work)
            if n > 1:
                # What the bound owes to the claim's size: a tenth of it.
                order = _order(conns, "synced-head", work, SMALL_CLAIM)
                entry[f"synced-head_claims_of_{SMALL_CLAIM}"] = _figures(order, reference, work)
        finally:
            for conn in conns:
                conn.close()
        entry["claim_complete_tasks_per_s"] = round(_throughput(urls[:n], tasks, tenants, claimers))
        results[f"{n}_primaries"] = entry
    one = results["1_primaries"]["claim_complete_tasks_per_s"]
    return {
        "params": {
            "scale": scale,
            "workload_tasks": len(work.first) + len(work.late),
            "claim_size": CLAIM,
            "throughput_tasks": tasks,
            "throughput_tenants": tenants,
            "claimers": claimers,
        },
        "results": results,
        "throughput_ratio_to_one": {
            key: round(entry["claim_complete_tasks_per_s"] / one, 3)
            for key, entry in results.items()
        },
    }
