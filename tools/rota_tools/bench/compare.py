"""`rota bench compare` (docs/howto/benchmarks.md): each side's `rota bench
SCENARIO --json` run from its own tree, A B then B A (neither always on the
warmer or busier half of a round), rounds going round every stage (a noisy
minute spreads over them all), on a database made afresh and a flushed Redis
each run (neither side inherits the other's bloat or schema). A change
counts as real only when the two sides' ranges do not overlap: on a shared
2-core machine a single run can be 25% off.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from rota_tools.sql import query
from rota_tools.stats import in_turns


@dataclass(frozen=True)
class Metric:
    label: str
    path: tuple[str, ...]  # keys into the scenario's JSON report
    higher_is_better: bool


@dataclass(frozen=True)
class Stage:
    """A `rota bench` scenario with the arguments the A/B runs use, and the
    figures read off its report."""

    args: tuple[str, ...]
    metrics: tuple[Metric, ...]
    redis: bool = True


def _m(label: str, path: str, higher: bool = True) -> Metric:
    return Metric(label, tuple(path.split(".")), higher)


def _pipeline_load(engine: str, tasks: int, rate_label: str) -> Stage:
    """`rota bench load --engine python|spark`: the same figures either way."""
    return Stage(
        ("load", "--engine", engine, "--tasks", str(tasks), "--runs", "1"),
        (
            _m(rate_label, "sustained_tasks_per_s"),
            _m("enqueue → load's start p50 ms", "enqueue_to_claimable_ms.p50", higher=False),
            _m("enqueue → committed p50 ms", "enqueue_to_committed_ms.p50", higher=False),
            _m("enqueue → committed p99 ms", "enqueue_to_committed_ms.p99", higher=False),
        ),
    )


SYNC, BASELINE_P50 = "synchronous_commit", "baseline.enqueue_to_start_ms.p50"
FLEET, PG_US = "systems", "postgres_cpu_us_per_task"
# Sized to take a minute or two a run: rounds, not run length, buy precision.
STAGES: dict[str, Stage] = {
    "enqueue": Stage(
        ("enqueue", "--tasks", "100000", "--runs", "1"),
        (
            _m("enqueue_many tasks/s", "enqueue_many_tasks_per_s"),
            _m("… ÷ plain pipelined XADD", "ratio_to_plain_pipelining"),
            _m("single enqueue p50 ms", "single_enqueue_ms.p50", higher=False),
            _m("fallback enqueue_many tasks/s", "fallback_enqueue_many_tasks_per_s"),
        ),
    ),
    "load": _pipeline_load("python", 100_000, "Python loader, 2 processes, tasks/s"),
    "load-core": Stage(
        ("load", "--engine", "core", "--tasks", "100000", "--runs", "1"),
        (
            _m("fair bulk load tasks/s", "fair_load_tasks_per_s"),
            _m("… ÷ raw COPY", "fair_to_raw_ratio"),
        ),
        redis=False,
    ),
    "load-spark": _pipeline_load("spark", 200_000, "Spark loader tasks/s"),
    "load-parallel": Stage(
        ("load", "--engine", "core", "--tasks", "100000", "--runs", "1", "--connections", "2"),
        (
            _m("one queue, 2 connections, tasks/s", "parallel.tasks_per_s"),
            _m("… ÷ 1 connection", "parallel.ratio_to_one"),
            _m("lock wait samples", "parallel.lock_wait_samples", higher=False),
        ),
        redis=False,
    ),
    "claim": Stage(
        ("claim", "--backlogs", "10000,1000000", "--runs", "1", "--samples", "100"),
        (
            _m("claim + complete tasks/s", "claim_complete_tasks_per_s"),
            _m("… ÷ plain FIFO", "ratio_to_fifo_baseline"),
            _m("claim p50 ÷ FIFO's", "p50_ratio_to_fifo_baseline", higher=False),
            _m("… ÷ leased FIFO", "ratio_to_leased_fifo_baseline"),
            _m("claim p50 ÷ leased FIFO's", "p50_ratio_to_leased_fifo_baseline", higher=False),
        ),
        redis=False,
    ),
    "work": Stage(
        ("work", "--tasks", "30000"),
        (
            _m("1 process tasks/s", "tasks_per_s.1_process"),
            _m("2 processes tasks/s", "tasks_per_s.2_process"),
            _m("1 process ÷ pgqueuer", "ratio_to_pgqueuer.1_process"),
            _m("2 processes ÷ pgqueuer", "ratio_to_pgqueuer.2_process"),
            _m("1 process, synchronous commit, tasks/s", f"{SYNC}_tasks_per_s.1_process"),
            _m("… ÷ pgqueuer (synchronous commit)", f"{SYNC}_ratio_to_pgqueuer.1_process"),
            _m("enqueue → start p50 ms (NOTIFY)", "enqueue_to_start_ms.p50", higher=False),
            _m("1 process keeping results ÷ without", "results.ratio_to_without"),
            _m("result.get() after the end p50 ms", "results.get_after_end_ms.p50", higher=False),
        ),
    ),
    "end-to-end": Stage(
        ("end-to-end", "--rate", "20000", "--tasks", "100000", "--tenants", "1000"),
        (
            _m("achieved tasks/s", "tasks_per_s"),
            _m("enqueue → start p50 ms", "enqueue_to_start_ms.p50", higher=False),
            _m("enqueue → start p99 ms", "enqueue_to_start_ms.p99", higher=False),
            _m("PostgreSQL, cores", "cpu.per_process.postgresql.cores", higher=False),
            _m("all processes, cores", "cpu.all_cores", higher=False),
            _m("all processes, µs of CPU per task", "cpu.all_us_per_task", higher=False),
        ),
    ),
    "start": Stage(
        ("end-to-end", "--rate", "250", "--tasks", "5000"),
        (
            _m("enqueue → start p50 ms", "enqueue_to_start_ms.p50", higher=False),
            _m("enqueue → start p99 ms", "enqueue_to_start_ms.p99", higher=False),
            _m("Redis pop p50 ms", "redis_pop_baseline.enqueue_to_start_ms.p50", higher=False),
            _m("p50 over the Redis pop, ms", "p50_over_redis_pop_ms", higher=False),
            _m("PostgreSQL queue p50 ms", f"postgres_queue_{BASELINE_P50}", higher=False),
            _m("p50 over the PostgreSQL queue, ms", "p50_over_postgres_queue_ms", higher=False),
            _m("pgqueuer p50 ms", "pgqueuer_baseline.enqueue_to_start_ms.p50", higher=False),
            _m("pgqueuer p99 ms", "pgqueuer_baseline.enqueue_to_start_ms.p99", higher=False),
        ),
    ),
    "fleet": Stage(
        (
            "fleet",
            *("--handlers", "8x32", "--rate", "2000", "--seconds", "10", "--stall-seconds", "3"),
            *("--sweep-rates", "250,500,1000,2000,4000,8000", "--sweep-seconds", "5"),
        ),
        (
            _m("rota, PostgreSQL µs per task", f"{FLEET}.rota.{PG_US}", higher=False),
            _m("rota direct, PostgreSQL µs per task", f"{FLEET}.rota_direct.{PG_US}", False),
            _m("pgqueuer, PostgreSQL µs per task", f"{FLEET}.pgqueuer.{PG_US}", higher=False),
            _m("procrastinate, PostgreSQL µs per task", f"{FLEET}.procrastinate.{PG_US}", False),
            _m(
                "INSERT per request, PostgreSQL µs per task",
                f"{FLEET}.insert_per_request.{PG_US}",
                False,
            ),
            _m("rota handler p99 ms", f"{FLEET}.rota.handler_ms.p99", higher=False),
            _m("rota handler max ms", f"{FLEET}.rota.handler_ms.max", higher=False),
            _m(
                "rota PostgreSQL CPU ÷ its direct path's",
                "ratios.postgres_cpu_to_rota_direct",
                False,
            ),
            _m("rota PostgreSQL CPU ÷ best peer's", "ratios.postgres_cpu_to_best_peer", False),
            _m("rota handler p99 ÷ best peer's", "ratios.handler_p99_to_best_peer", False),
            _m("rota highest rate at p99 ≤ 5 ms", "sweep.rota.rate_per_s"),
            _m("… ÷ best peer's", "ratios.sweep_rate_to_best_peer"),
            _m("rota handler max ms, 3 s stall", f"{FLEET}.rota.stall.handler_ms.max", False),
            _m("rota handler failures, 3 s stall", f"{FLEET}.rota.stall.failed", False),
            _m("rota tasks lost, 3 s stall", f"{FLEET}.rota.stall.lost", False),
        ),
    ),
}
DEFAULT_STAGES = ("enqueue", "load", "claim", "work", "end-to-end", "start")


class CompareError(RuntimeError):
    """The comparison cannot be set up (an unknown revision, stage or argument)."""


@dataclass
class Side:
    """One version of the code: the tree it runs from and the extra import
    path its missing dependencies went to."""

    name: str
    revision: str  # a commit id, or "working tree"
    tree: Path
    extra_path: Path | None = None

    def env(self) -> dict[str, str]:
        # The tools' own distribution, under tools/ (an older commit's tree has none).
        tools = [str(self.tree / "tools")] if (self.tree / "tools").is_dir() else []
        paths = [str(self.tree), *tools] + ([str(self.extra_path)] if self.extra_path else [])
        return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


@dataclass
class Result:
    reports: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    environment = {**os.environ, **env} if env else None
    command = ["git", "-C", str(repo), *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
    if done.returncode != 0:
        raise CompareError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def repository_root() -> Path:
    """The checkout this code runs from (the candidate's tree by default)."""
    return Path(git(Path(__file__).resolve().parent, "rev-parse", "--show-toplevel"))


def snapshot(repo: Path) -> tuple[str, str]:
    """A commit of the working tree as it is now (uncommitted changes and new
    files not ignored included; the index and the tree are left as they are),
    so that edits made while a comparison runs do not leak into it; and its
    name."""
    head = git(repo, "rev-parse", "HEAD")
    with tempfile.TemporaryDirectory(prefix="rota-ab-index-") as scratch:
        index = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        git(repo, "read-tree", "HEAD", env=index)
        git(repo, "add", "--all", env=index)
        tree = git(repo, "write-tree", env=index)
    if tree == git(repo, "rev-parse", "HEAD^{tree}"):
        return head, head[:10]
    message = "rota bench compare: the working tree"
    return git(repo, "commit-tree", tree, "-p", head, "-m", message), head[:10] + "+changes"


def missing_requirements(pyproject: Path) -> list[str]:
    """The tree's declared dependencies (with the extras benchmarks use) that
    this interpreter does not satisfy."""
    from packaging.requirements import Requirement  # rota-tools[bench]

    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    wanted = list(project.get("dependencies", []))
    for extra in ("bench", "spark"):
        wanted += project.get("optional-dependencies", {}).get(extra, [])
    missing = []
    for spec in wanted:
        requirement = Requirement(spec)
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(spec)
            continue
        if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            missing.append(spec)
    return missing


@contextlib.contextmanager
def checkout(
    repo: Path, revision: str, name: str, keep: bool = False, label: str | None = None
) -> Iterator[Side]:
    """A throw-away worktree of `revision` and the dependencies it lacks."""
    commit = git(repo, "rev-parse", "--verify", f"{revision}^{{commit}}")
    place = Path(tempfile.mkdtemp(prefix=f"rota-ab-{commit[:10]}-"))
    tree = place / "tree"
    git(repo, "worktree", "add", "--detach", str(tree), commit)
    try:
        extra = None
        missing = missing_requirements(tree / "pyproject.toml")
        if (tree / "tools" / "pyproject.toml").is_file():
            missing += missing_requirements(tree / "tools" / "pyproject.toml")
        if missing:
            extra = place / "site"
            pip = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(extra)]
            subprocess.run([*pip, *missing], check=True)
        yield Side(name, label or commit, tree, extra)
    finally:
        if not keep:
            git(repo, "worktree", "remove", "--force", str(tree))
            shutil.rmtree(place, ignore_errors=True)


def fresh_servers(admin_url: str, database: str, redis_url: str | None) -> str:
    """Drops and recreates the benchmark database, flushes Redis; returns the
    database's URL."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        name = sql.Identifier(database)
        conn.execute(sql.SQL(query("bench_compare_drop_database")).format(database=name))
        conn.execute(sql.SQL(query("bench_compare_create_database")).format(database=name))
        conn.execute(query("bench_compare_checkpoint"))
    if redis_url is not None:
        import redis

        with redis.Redis.from_url(redis_url) as client:
            client.flushall()
    return admin_url.rsplit("/", 1)[0] + "/" + database


def run_scenario(
    side: Side, args: Sequence[str], database_url: str, redis_url: str | None, timeout: float
) -> dict[str, Any]:
    """One `rota bench` run from the side's tree; its JSON report."""
    command = [sys.executable, "-m", "rota", "bench", *args, "--json"]
    command += ["--database-url", database_url]
    if redis_url is not None:
        command += ["--redis-url", redis_url]
    done = subprocess.run(
        command, cwd=side.tree, env=side.env(), capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"exit {done.returncode}: {tail}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def figure(report: dict[str, Any], path: Sequence[str]) -> float | None:
    value: Any = report
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value) if isinstance(value, int | float) else None


def summarise(values: Sequence[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": list(values),
    }


def verdict(metric: Metric, base: Sequence[float], new: Sequence[float]) -> dict[str, Any]:
    """Medians, spreads and the change of one figure. The change is outside
    the spread only when the two sides' ranges do not overlap. A figure one
    side does not report (one a later commit added) is shown alone."""
    a, b = (summarise(values) if values else None for values in (base, new))
    change, disjoint = None, False
    if a is None or b is None:
        outcome = "baseline does not report it" if new else "candidate does not report it"
    else:
        change = (b["median"] - a["median"]) / a["median"] if a["median"] else None
        # One run each has no spread to judge a change by.
        judged = len(base) > 1 and len(new) > 1
        disjoint = judged and (a["max"] < b["min"] or b["max"] < a["min"])
        if not judged:
            outcome = "one run: no spread"
        elif not disjoint or change is None:
            outcome = "within noise"
        else:
            outcome = "better" if (change > 0) == metric.higher_is_better else "worse"
    return {
        "baseline": a,
        "candidate": b,
        "change": change,
        "outside_spread": disjoint,
        "outcome": outcome,
        "higher_is_better": metric.higher_is_better,
    }


def stage_table(
    stage: str, metrics: Sequence[Metric], figures: dict[str, dict[str, Any]], names: Sequence[str]
) -> str:
    """A Markdown table of one stage's figures."""

    def cell(s: dict[str, Any] | None) -> str:
        if s is None:
            return "-"
        return f"{fmt(s['median'])} ({fmt(s['min'])}-{fmt(s['max'])})"

    lines = [
        f"### {stage}",
        "",
        f"| figure | {names[0]} | {names[1]} | change | outcome |",
        "|---|---|---|---|---|",
    ]
    for metric in metrics:
        row = figures.get(metric.label)
        if row is None:
            lines.append(f"| {metric.label} | - | - | - | not reported |")
            continue
        change = "-" if row["change"] is None else f"{row['change']:+.1%}"
        lines.append(
            f"| {metric.label} | {cell(row['baseline'])} | {cell(row['candidate'])} "
            f"| {change} | {row['outcome']} |"
        )
    return "\n".join(lines)


def fmt(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value / 1000:.1f}k"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


# Options a newer bench has that change what it measures, with the value
# that measures as before: passed to a side only when the other lacks them,
# so both sides of an A/B measure the same way.
MEASURED_AS_BEFORE = {"load-spark": ("--spark-warm-up-batches", "0")}


def _accepts(side: Side, args: Sequence[str], option: str) -> bool:
    """Whether the side's `rota bench SCENARIO` takes `option`."""
    command = [sys.executable, "-m", "rota", "bench", args[0], "--help"]
    env = {**side.env(), "COLUMNS": "200"}
    done = subprocess.run(
        command, cwd=side.tree, env=env, capture_output=True, text=True, timeout=120
    )
    return option in done.stdout


def side_args(
    sides: tuple[Side, Side], stage: str, args: list[str], log: Callable[[str], None]
) -> dict[str, list[str]]:
    """Each side's arguments for `stage`: the same, but for an option only one
    side has (MEASURED_AS_BEFORE), given to it with its former value."""
    out = {side.name: list(args) for side in sides}
    if stage in MEASURED_AS_BEFORE:
        option, value = MEASURED_AS_BEFORE[stage]
        has = {side.name: _accepts(side, args, option) for side in sides}
        if len(set(has.values())) == 2:
            for side in sides:
                if has[side.name]:
                    out[side.name] += [option, value]
                    log(f"{stage}: {side.name} runs with {option} {value}, as the other measures")
    return out


def compare(
    sides: tuple[Side, Side],
    stages: Sequence[str],
    rounds: int,
    admin_url: str,
    redis_url: str,
    extra_args: dict[str, list[str]],
    timeout: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Runs every stage on both sides, alternating, `rounds` times; returns
    the raw reports and each figure's verdict."""
    results = {(stage, side.name): Result() for stage in stages for side in sides}
    args_of = {
        stage: side_args(sides, stage, [*STAGES[stage].args, *extra_args.get(stage, [])], log)
        for stage in stages
    }
    for round_number in range(rounds):
        order = in_turns(sides, round_number)
        for stage in stages:
            spec = STAGES[stage]
            for side in order:
                args = args_of[stage][side.name]
                url = fresh_servers(admin_url, "rota_ab", redis_url if spec.redis else None)
                started = time.monotonic()
                result = results[(stage, side.name)]
                try:
                    result.reports.append(
                        run_scenario(side, args, url, redis_url if spec.redis else None, timeout)
                    )
                    outcome = "ok"
                except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                    result.failures.append(str(exc))
                    outcome = f"failed: {exc}"
                log(
                    f"round {round_number + 1}/{rounds} {stage} {side.name}: "
                    f"{outcome} ({time.monotonic() - started:.0f} s)"
                )
    out: dict[str, Any] = {}
    for stage in stages:
        spec = STAGES[stage]
        figures: dict[str, dict[str, Any]] = {}
        for metric in spec.metrics:
            base = _values(results[(stage, sides[0].name)].reports, metric)
            new = _values(results[(stage, sides[1].name)].reports, metric)
            if base or new:
                figures[metric.label] = verdict(metric, base, new)
        out[stage] = {
            "args": [*spec.args, *extra_args.get(stage, [])],
            "figures": figures,
            "failures": {
                side.name: results[(stage, side.name)].failures
                for side in sides
                if results[(stage, side.name)].failures
            },
            "reports": {side.name: results[(stage, side.name)].reports for side in sides},
        }
    return out


def _values(reports: Sequence[dict[str, Any]], metric: Metric) -> list[float]:
    return [v for v in (figure(r, metric.path) for r in reports) if v is not None]


def parse_extra_args(settings: Sequence[str]) -> dict[str, list[str]]:
    """`STAGE=ARGS` pairs (e.g. `claim=--seconds 10`) into {stage: argv}."""
    extra: dict[str, list[str]] = {}
    for item in settings:
        stage, sep, args = item.partition("=")
        if not sep or stage not in STAGES:
            raise CompareError(
                f"--set {item!r}: expected STAGE=ARGS with STAGE one of {', '.join(STAGES)}"
            )
        extra.setdefault(stage, []).extend(shlex.split(args))
    return extra


def parse_stages(text: str) -> list[str]:
    stages = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise CompareError(
            f"unknown stage(s) {', '.join(unknown) or '(none)'}: choose from {', '.join(STAGES)}"
        )
    return stages
