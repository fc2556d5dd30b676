"""The benchmark tier (`make test-bench`, part of `make test`): each `rota
bench ... --json` scenario in a small configuration. Each test asserts what
its scenario must show whatever the machine's speed: the run's correctness,
the relations between its figures that hold by construction (a rate within
what its CPU cost allows, a fair load costlier than a COPY into the same
indexes, p50 at most p99), never a speed (the machines are noisy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from rota import Settings
from rota_tools.bench.harness import WARM_UP
from rota_tools.devservers import Server

pytestmark = pytest.mark.slow(
    reason="each test runs a real benchmark, `rota bench`, in a subprocess"
)


def bench(settings: Settings, *args: str, tmp: Path | None = None) -> dict[str, Any]:
    env = {
        **os.environ,
        "ROTA_DATABASE_URL": settings.database_url,
        "ROTA_REDIS_URL": settings.redis_url,
        **({"TMPDIR": str(tmp)} if tmp else {}),
    }
    done = subprocess.run(
        [sys.executable, "-m", "rota", "bench", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=240,  # within the slow budget (pyproject slow_timeout)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["machine"]["cpus"] >= 1
    return report


def test_bench_load_core(settings: Settings) -> None:
    report = bench(settings, "load", "--tasks", "3000", "--tenants", "50", "--runs", "1")
    assert report["scenario"] == "load"
    # Each figure measured, and each ratio of the same run's figures. Which
    # is faster is the benchmark's to say, not a test's: three thousand rows
    # load in tens of milliseconds, within the noise of a shared machine.
    fair, raw = report["fair_load_tasks_per_s"], report["raw_copy_rows_per_s"]
    indexed = report["fair_index_copy_rows_per_s"]
    assert fair > 0 and raw > 0 and indexed > 0
    assert report["fair_to_raw_ratio"] == pytest.approx(fair / raw, abs=1e-3)
    assert report["fair_index_copy_to_raw_ratio"] == pytest.approx(indexed / raw, abs=1e-3)
    # What the primary spends per task: its CPU (the server is local here) and
    # WAL, at least a task's row and its place in line.
    assert report["postgresql_per_task"]["cpu_us"] > 0
    assert report["postgresql_per_task"]["wal_bytes"] > 200


def test_bench_load_from_several_connections(settings: Settings) -> None:
    report = bench(
        settings,
        "load",
        *("--tasks", "20000", "--tenants", "40", "--runs", "1", "--connections", "2"),
    )
    parallel = report["parallel"]
    assert parallel["params"]["connections"] == 2
    assert parallel["tasks_per_s"] > 0 and parallel["one_connection_tasks_per_s"] > 0
    assert parallel["ratio_to_one"] > 0
    assert parallel["backend_samples"] > 0  # the sampler saw the loaders at work
    # Disjoint tenants of one queue: no load waits on another's rows.
    assert parallel["row_lock_wait_samples"] == 0, parallel["waits"]


def test_bench_load_with_even_tenants(settings: Settings) -> None:
    report = bench(
        settings,
        "load",
        *("--engine", "python", "--tasks", "2000", "--tenants", "10", "--runs", "1"),
        *("--trickle-seconds", "1", "--even-tenants"),
    )
    assert report["params"]["even_tenants"] is True
    # The backlog the loaders loaded: 200 tasks each (by default, one holds half).
    assert report["backlog_largest_tenant_share"] == pytest.approx(0.1, abs=0.001)
    # What it leaves is the trickle's tasks (and the warm-up's one, of a
    # tenant of its own), spread over the ten tenants alike; by default one
    # tenant holds half.
    with psycopg.connect(settings.database_url) as conn:
        counts = [
            n
            for (n,) in conn.execute(
                "SELECT count(*) FROM rota.tasks t JOIN rota.tenants n ON n.id = t.tenant_id"
                " WHERE n.name <> %s GROUP BY t.tenant_id ORDER BY 1",
                [WARM_UP],
            ).fetchall()
        ]
    assert len(counts) == 10 and counts[-1] - counts[0] <= 2, counts


def test_bench_load_python_engine(settings: Settings) -> None:
    report = bench(
        settings,
        "load",
        *("--engine", "python", "--tasks", "3000", "--tenants", "50", "--runs", "1"),
        *("--trickle-seconds", "1"),
    )
    assert report["sustained_tasks_per_s"] > 0
    assert report["backlog_largest_tenant_share"] == pytest.approx(0.5, abs=0.001)
    assert report["enqueue_to_claimable_ms"]["tasks"] > 0
    # Each task commits after its load began: timed to the commit, not the start.
    committed, started = report["enqueue_to_committed_ms"], report["enqueue_to_claimable_ms"]
    assert committed["p50"] > started["p50"] and committed["p99"] > started["p99"]


@pytest.mark.spark
def test_bench_load_spark_engine(settings: Settings, tmp_path: Path) -> None:
    elsewhere = set(Path("/tmp").glob("rota-bench-ckpt-*"))
    report = bench(
        settings,
        "load",
        *("--engine", "spark", "--tasks", "3000", "--tenants", "50", "--runs", "1"),
        *("--trickle-seconds", "1", "--spark-warm-up-batches", "3", "--even-tenants"),
        tmp=tmp_path,
    )
    # The Spark loader's backlog: 60 tasks a tenant, and the warm-up task.
    assert report["backlog_largest_tenant_share"] == pytest.approx(60 / 3001, abs=0.001)
    # Untimed first: micro-batches of 2,000 tasks, each loaded before the next.
    assert report["jvm_warm_up"]["tasks"] == 6000
    assert report["jvm_warm_up"]["micro_batches"] >= 3
    # Its queries' checkpoints are removed (it leaves its Spark log only).
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("rota-bench")] == []
    assert set(Path("/tmp").glob("rota-bench-ckpt-*")) <= elsewhere
    # The warm-up task, then the whole backlog, which appears at once, in one micro-batch.
    assert report["micro_batch_tasks"] == [[1, 3000]]
    assert report["warm_up_run_tasks_per_s"] > 0  # the untimed run before
    assert report["enqueue_to_claimable_ms"]["tasks"] > 0
    # Each engine's rate is within what its CPU per task allows on these cores.
    cpu = report["machine_cpu_us_per_task"]
    assert set(cpu) == {"spark", "spark_executor_code", "python_1_process", "python_2_process"}
    cores = report["machine"]["cpus"]
    rates = {
        "spark": report["sustained_tasks_per_s"],
        "spark_executor_code": report["spark_executor_code_tasks_per_s"],
        **{f"python_{n}": r for n, r in report["python_loader_tasks_per_s"].items()},
    }
    for engine, rate in rates.items():
        assert 0 < rate <= 1.1 * cores * 1e6 / cpu[engine], (engine, rate, cpu)
    assert report["spark_to_two_python_loaders"] == pytest.approx(
        rates["spark"] / rates["python_2_process"], abs=0.002
    )
    # The executors' code without Spark ran in the same runs (the bench
    # checks it stored every task); its ratios are of the rates reported.
    assert report["spark_to_its_executor_code"] == pytest.approx(
        rates["spark"] / rates["spark_executor_code"], abs=0.002
    )
    assert report["executor_code_to_two_python_loaders"] == pytest.approx(
        rates["spark_executor_code"] / rates["python_2_process"], abs=0.002
    )
    # The micro-batches under the trickle, phase by phase (Spark's own timings).
    phases = report["latency_micro_batch_ms"]
    assert phases["batches"] >= 1
    assert phases["triggerExecution"] >= phases["addBatch"] >= 0
    # The same query doing no work waits less than the loader's tasks do, and
    # at least the start of a batch.
    floor = report["micro_batch_floor"]
    assert floor["batches"] >= 1
    waits = floor["enqueue_to_read_ms"]
    assert 0 < waits["p50"] <= waits["p99"]
    assert waits["p50"] < report["enqueue_to_committed_ms"]["p50"]
    assert floor["micro_batch_ms"]["triggerExecution"] >= floor["micro_batch_ms"]["addBatch"] > 0


@pytest.mark.spark
def test_bench_import(settings: Settings) -> None:
    report = bench(settings, "import", "--rows", "20000", "--tenants", "50")
    # The bench checks every row loaded; here, where the CPU went.
    cpu = report["import_cpu_us_per_row"]
    assert {"spark", "driver_python", "postgresql", "all"} <= set(cpu)
    assert cpu["all"] == pytest.approx(sum(v for k, v in cpu.items() if k != "all"), abs=0.2)
    # Only processes are counted, so the bound can only overstate what the
    # cores allow: the import never passes it.
    assert 0 < report["import_rows_per_s"] <= 1.1 * report["cpu_bound_rows_per_s"]
    # A fair load costs PostgreSQL more per row than a COPY into the same indexes.
    assert cpu["postgresql"] > report["ceiling_postgresql_cpu_us_per_row"] > 0
    driver = report["driver"]
    assert 0 < driver["jvm_peak_rss_mb_import"] <= driver["jvm_peak_rss_mb"]


def test_bench_claim(settings: Settings) -> None:
    report = bench(
        settings,
        "claim",
        "--backlogs",
        "2000,4000",
        "--tenants",
        "50",
        "--samples",
        "10",
        "--seconds",
        "0.5",
        "--runs",
        "1",
        "--connections",
        "2",
    )
    assert set(report["claim_latency"]) == {"2000", "4000", "4000_after_churn"}
    # The plain SKIP LOCKED claims, timed in the same turns: the FIFO at both
    # backlogs, the leased FIFO at the largest.
    assert set(report["fifo_baseline_claim_latency"]) == {"2000", "4000"}
    assert report["p50_ratio_to_fifo_baseline"] > 0
    assert report["fifo_baseline_p50_ratio_largest_to_smallest"] > 0
    assert set(report["leased_fifo_baseline_claim_latency"]) == {"4000"}
    assert report["p50_ratio_to_leased_fifo_baseline"] > 0
    assert report["claim_complete_tasks_per_s"] > 0 and report["fifo_baseline_tasks_per_s"] > 0
    assert report["leased_fifo_baseline_tasks_per_s"] > 0
    assert report["postgresql_per_task"]["cpu_us"] > 0
    assert report["postgresql_per_task"]["wal_bytes"] > 0
    # rota's rows written directly, beside rota and the leased FIFO: the
    # ratios are of the rates reported, and each queue's costs were taken.
    direct = report["rows_direct_tasks_per_s"]
    assert direct > 0
    assert report["ratio_to_rows_direct"] == pytest.approx(
        report["claim_complete_tasks_per_s"] / direct, abs=0.002
    )
    assert report["rows_direct_to_leased_fifo"] == pytest.approx(
        direct / report["leased_fifo_baseline_tasks_per_s"], abs=0.002
    )
    by_queue = report["per_task_by_queue"]
    assert set(by_queue) == {"rota", "rows_direct", "leased_fifo"}
    for costs in by_queue.values():
        assert costs["cpu_us"] > 0 and costs["wal_bytes"] > 0 and costs["client_cpu_us"] > 0


def test_bench_enqueue(settings: Settings) -> None:
    report = bench(settings, "enqueue", "--tasks", "3000", "--tenants", "50", "--runs", "1")
    assert report["enqueue_many_tasks_per_s"] > 0
    assert report["fallback_enqueue_many_tasks_per_s"] > 0
    assert 0 < report["single_enqueue_ms"]["p50"] <= report["single_enqueue_ms"]["p99"]


def test_bench_work(settings: Settings) -> None:
    report = bench(settings, "work", "--tasks", "500", "--tenants", "20")
    # (500 tasks can all end before the clock starts: a rate may be 0 here.)
    assert set(report["tasks_per_s"]) == {"1_process", "2_process"}
    assert 0 < report["enqueue_to_start_ms"]["p50"] <= report["enqueue_to_start_ms"]["p99"]
    assert report["results"]["get_after_end_ms"]["p50"] > 0


def test_bench_work_with_progress_counts_the_progress_writes(settings: Settings) -> None:
    report = bench(settings, "work", "--tasks", "500", "--tenants", "20", "--progress")
    progress = report["progress"]
    assert progress["reported_by_every_task"] is True
    assert set(progress["runs"]) == {
        "1",
        "2",
        "1_synchronous_commit",
        "2_synchronous_commit",
        "1_results",
    }
    for runs in progress["runs"].values():
        for run in runs:
            # Each task's one report is stored, many tasks to a flush.
            assert run["tasks"] == 500 and run["writes"] >= 500
            assert 1 <= run["flushes"] < 500


def test_bench_cancel(settings: Settings) -> None:
    report = bench(settings, "cancel", "--runs", "2")
    for kind in ("sync_cooperative", "async"):
        latency = report[kind]["cancel_to_cancelled_ms"]
        assert 0 < latency["p50"] <= latency["p99"]


def test_fairness_scenarios_against_the_baselines(settings: Settings) -> None:
    for scenario in ("noisy-neighbour", "zipf", "weighted", "cost"):
        report = bench(settings, scenario, "--scale", "3")
        results = report["results"]
        assert {"rota", "fifo", "partition-by"} <= set(results)
        assert 0 < results["rota"]["jain_index_first_half"] <= 1
        if scenario == "noisy-neighbour":
            # The run's correctness, not its speed: quiet tenants go first under rota.
            assert report["ratios"]["quiet_wait_vs_fifo"] < 0.5
            assert report["ratios"]["quiet_wait_flood_vs_alone"] < 2
        if scenario == "weighted":
            shares = results["rota"]["shares_first_half"]
            assert shares["gold"] > shares["silver"]


def test_backlog_scaling_lock_pressure_and_end_to_end(settings: Settings) -> None:
    scaling = bench(
        settings,
        "backlog-scaling",
        "--backlogs",
        "1000,3000",
        "--tenants",
        "30",
        "--samples",
        "10",
        "--connections",
        "2",
    )
    assert set(scaling["claim_latency"]) == {"1000", "3000", "3000_after_churn"}
    locks = bench(
        settings, "lock-pressure", "--tenants", "30", "--connections", "3", "--seconds", "0.5"
    )
    assert locks["samples"] > 0 and locks["max_relations_locked_by_one_backend"] > 0
    e2e = bench(
        settings, "end-to-end", "--tasks", "300", "--tenants", "10", "--rate", "300", "--pgbouncer"
    )
    assert e2e["tasks_per_s"] > 0 and e2e["enqueue_to_start_ms"]["p50"] > 0
    assert e2e["params"]["database_pooling"] == "none"
    # Counted on the wire, one task at a time: the producer's write, the
    # loader's read (ended by the write) and its one-statement load, the
    # worker's claim.
    trips = e2e["round_trips"]
    assert (trips["producer"], trips["loader"], trips["worker"], trips["total"]) == (1, 2, 1, 4)
    cpu = e2e["cpu"]
    assert {"producer", "loader", "worker_1", "worker_2", "postgresql"} <= set(cpu["per_process"])
    assert cpu["all_us_per_task"] == pytest.approx(
        sum(p["us_per_task"] for p in cpu["per_process"].values()), abs=0.5
    )
    # Simpler designs at the same pace: Redis alone, a durable queue written
    # straight into PostgreSQL, and pgqueuer. Each consumer timed every task
    # (a shortfall raises), and the report says what rota adds to the first two.
    for key in ("redis_pop_baseline", "postgres_queue_baseline", "pgqueuer_baseline"):
        floor = e2e[key]
        assert floor["tasks"] == 300 and floor["enqueue_to_start_ms"]["p50"] > 0, key
        assert floor["enqueue_to_start_ms"]["p99"] >= floor["enqueue_to_start_ms"]["p50"], key
    for key, floor in (
        ("redis_pop", "redis_pop_baseline"),
        ("postgres_queue", "postgres_queue_baseline"),
    ):
        assert e2e[f"p50_over_{key}_ms"] == pytest.approx(
            e2e["enqueue_to_start_ms"]["p50"] - e2e[floor]["enqueue_to_start_ms"]["p50"], abs=0.11
        )
    # The PostgreSQL queue flooded as rota was (every task, two consumers):
    # the floor of its throughput and CPU, and rota's ratios to it.
    flood = e2e["postgres_queue_flood"]
    assert flood["tasks"] == 300 and flood["tasks_per_s"] > 0
    assert set(flood["cpu"]["per_process"]) == {
        "producer",
        "consumer_1",
        "consumer_2",
        "postgresql",
    }
    assert flood["enqueue_to_start_ms"]["p99"] >= flood["enqueue_to_start_ms"]["p50"] > 0
    assert e2e["tasks_per_s_to_postgres_queue_flood"] == pytest.approx(
        e2e["tasks_per_s"] / flood["tasks_per_s"], rel=0.01
    )
    assert e2e["cpu_per_task_to_postgres_queue_flood"] == pytest.approx(
        cpu["all_us_per_task"] / flood["cpu"]["all_us_per_task"], rel=0.01
    )
    assert flood["left"] == 0
    # Flooded again, each time with one thing every rota task has: its record
    # kept at completion, its function run by a pool of threads. Every task
    # was completed, and the kept floor left a record of each.
    for floor in ("kept", "threads"):
        floored = e2e[f"postgres_queue_flood_{floor}"]
        assert floored["tasks"] == 300 and floored["tasks_per_s"] > 0, floor
        assert set(floored["cpu"]["per_process"]) == set(flood["cpu"]["per_process"]), floor
        assert floored["left"] == 0, floor
    assert e2e["postgres_queue_flood_kept"]["records_kept"] == 300
    # Again behind PgBouncer in transaction mode: LISTEN on the direct URL, then polling.
    for key, listen in (("pgbouncer_listen", True), ("pgbouncer_poll", False)):
        pooled = e2e[key]
        assert pooled["params"]["database_pooling"] == "transaction"
        assert pooled["params"]["listen"] is listen
        assert pooled["tasks_per_s"] > 0
        assert pooled["cpu"]["per_process"]["pgbouncer"]["seconds"] > 0


def test_bench_shards(settings: Settings) -> None:
    report = bench(
        settings,
        "shards",
        "--primaries",
        "2",
        "--tasks",
        "2000",
        "--tenants",
        "20",
        "--claimers",
        "2",
    )
    one, two = report["results"]["1_primaries"], report["results"]["2_primaries"]
    assert one["head"]["displacement_vs_one_primary"]["max"] == 0  # the reference itself
    assert one["head"]["tasks"] == two["synced-head"]["tasks"] == report["params"]["workload_tasks"]
    assert sum(two["tenants_per_shard"]) == sum(one["tenants_per_shard"])
    # Merging the shards' lines by their heads, with a shared clock, keeps
    # every task near its place on one primary; drawing shards by backlog does not.
    synced = two["synced-head"]["displacement_vs_one_primary"]["max"]
    assert synced <= 2 * report["params"]["claim_size"]
    assert two["backlog"]["displacement_vs_one_primary"]["max"] > synced
    assert report["throughput_ratio_to_one"]["1_primaries"] == 1.0


def test_bench_statements(settings: Settings) -> None:
    report = bench(
        settings,
        "load",
        "--tasks",
        "2000",
        "--tenants",
        "20",
        "--runs",
        "1",
        "--local",
        "--statements",
    )
    statements = report["postgresql_statements"]
    assert statements and all(s["exec_us_per_task"] >= 0 for s in statements)
    assert any("rota." in s["query"] for s in statements)


def test_bench_console(settings: Settings) -> None:
    report = bench(
        # A backlog that outlasts the run on a fast, quiet machine too; windows
        # long enough for completions in each on a busy one.
        settings,
        "console",
        "--tasks",
        "400000",
        "--tenants",
        "100",
        "--seconds",
        "2",
        "--window",
        "0.5",
        "--runs",
        "1",
    )
    assert report["scenario"] == "console"
    assert set(report["reads"]) >= {"/", "/api/overview", "/tenants", "/metrics"}
    assert all(r["p50_ms"] > 0 for r in report["reads"].values())
    # One run of four windows: two pairs, each with completions on both sides.
    assert report["pairs"] == 2
    figures = report["claim_complete_tasks_per_s"]
    assert figures["with_console"] > 0 and figures["without_console"] > 0
    assert report["ratio_with_to_without"] > 0 and report["console_cpu_share"] > 0


def test_bench_compare_runs_both_sides_alternately(
    postgres_server: Server, redis_server: Server
) -> None:
    """HEAD against the working tree, two rounds of a small stage, on the
    given servers: each side runs in its own worktree, A B then B A."""
    worktrees_before = _worktrees()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rota",
            "bench",
            "compare",
            "--baseline",
            "HEAD",
            "--stages",
            "enqueue",
            "--rounds",
            "2",
            "--set",
            "enqueue=--tasks 2000 --tenants 20",
            "--database-url",
            postgres_server.url,
            "--redis-url",
            redis_server.url,
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert report["baseline"] == head
    assert report["candidate"].startswith(head[:10])
    stage = report["stages"]["enqueue"]
    assert stage["failures"] == {}
    assert [len(stage["reports"][side]) for side in ("baseline", "candidate")] == [2, 2]
    assert all(r["params"]["tasks"] == 2000 for r in stage["reports"]["baseline"])
    rate = stage["figures"]["enqueue_many tasks/s"]
    assert len(rate["baseline"]["runs"]) == 2 and rate["baseline"]["median"] > 0
    assert rate["outcome"] in {"better", "worse", "within noise"}
    order = [line.split()[3] for line in done.stderr.splitlines() if line.startswith("round")]
    assert order == ["baseline:", "candidate:", "candidate:", "baseline:"]
    # Its worktrees are gone (others' are not its business).
    assert _worktrees() == worktrees_before


def _worktrees() -> set[str]:
    listed = subprocess.run(
        ["git", "worktree", "list", "--porcelain"], capture_output=True, text=True, check=True
    ).stdout
    return {line for line in listed.splitlines() if line.startswith("worktree ")}


def test_bench_fleet(settings: Settings) -> None:
    report = bench(
        settings,
        "fleet",
        *("--handlers", "2x2", "--rate", "100", "--seconds", "2", "--stall-seconds", "1"),
        *("--sweep-rates", "50", "--sweep-seconds", "1"),
    )
    systems = report["systems"]
    assert list(systems) == [
        "rota",
        "rota_direct",
        "pgqueuer",
        "procrastinate",
        "insert_per_request",
    ]
    for name, system in systems.items():
        # Every task a handler was told was stored ran, through the stall too.
        assert system["acknowledged"] > 0, name
        assert system["ran"] == system["acknowledged"] and system["lost"] == 0, name
        assert system["requests"] == system["acknowledged"] + system["failed"], name
        assert system["postgres_cpu_us_per_task"] > 0 and system["postgres_cores"] > 0, name
        assert system["postgres_connections"] >= 2, name  # the consumers' at least
        assert sum(system["wait_events"].values()) > 0, name  # the sampler saw the server
        handler = system["handler_ms"]
        assert 0 < handler["p50"] <= handler["p99"] <= handler["p999"] <= handler["max"], name
        assert 0 < system["start_ms"]["p50"] <= system["start_ms"]["p99"], name
        stall = system["stall"]
        assert stall["seconds"] >= 1 and stall["requests"] > 0, name
        assert stall["lost"] == 0 and stall["run"]["ran"] == stall["run"]["acknowledged"], name
        if name != "rota":
            # A request that writes to PostgreSQL waits for the stopped server.
            assert stall["handler_ms"]["max"] >= 500, (name, stall)
        sweep = report["sweep"][name]
        (run,) = sweep["runs"]
        assert run["offered_per_s"] == 50
        assert sweep["rate_per_s"] == (50 if run["passed"] else 0), name
    # Redis up, a stalled PostgreSQL fails none of rota's requests.
    assert systems["rota"]["stall"]["failed"] == 0
    cpu = {name: s["postgres_cpu_us_per_task"] for name, s in systems.items()}
    p99 = {name: s["handler_ms"]["p99"] for name, s in systems.items()}
    ratios = report["ratios"]
    assert ratios["postgres_cpu_to_rota_direct"] == pytest.approx(
        cpu["rota"] / cpu["rota_direct"], abs=1e-3
    )
    best_cpu = min(cpu["pgqueuer"], cpu["procrastinate"])
    assert ratios["postgres_cpu_to_best_peer"] == pytest.approx(cpu["rota"] / best_cpu, abs=1e-3)
    best_p99 = min(p99["pgqueuer"], p99["procrastinate"])
    assert ratios["handler_p99_to_best_peer"] == pytest.approx(p99["rota"] / best_p99, abs=1e-3)
    best_rate = max(report["sweep"][p]["rate_per_s"] for p in ("pgqueuer", "procrastinate"))
    if best_rate:  # else no ratio: no peer passed at any rate swept
        expected = report["sweep"]["rota"]["rate_per_s"] / best_rate
        assert ratios["sweep_rate_to_best_peer"] == pytest.approx(expected, abs=1e-3)
    else:
        assert ratios["sweep_rate_to_best_peer"] is None
