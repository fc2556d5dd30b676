"""`rota bench end-to-end --tracing`: the whole pipeline with OpenTelemetry
tracing off and on, runs alternating on the same servers; each run in a
fresh process tree, so that the traced runs' tracer provider (set once per
process) touches only them."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import statistics
from pathlib import Path
from typing import Any

from rota import Settings

SITE = Path(__file__).parent / "tracing_site"
# Off; every span kept; one trace in ten kept.
MODES = ("off", "on", "sampled")


def _one_run(settings: Settings, tasks: int, tenants: int, rate: float, concurrency: int) -> Any:
    from rota_tools.bench.pipeline import bench_end_to_end

    return bench_end_to_end(settings, tasks, tenants, rate, concurrency)


def _run(settings: Settings, mode: str, *args: Any) -> dict[str, Any]:
    saved = dict(os.environ)
    if mode != "off":
        os.environ["ROTA_BENCH_TRACING"] = mode
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(SITE), os.environ.get("PYTHONPATH")])
        )
    try:
        spawn = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
            figures: dict[str, Any] = pool.submit(_one_run, settings, *args).result()
            return figures
    finally:
        os.environ.clear()
        os.environ.update(saved)


def bench_tracing(
    settings: Settings, tasks: int, tenants: int, rate: float, concurrency: int, rounds: int
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            runs[mode].append(_run(settings, mode, tasks, tenants, rate, concurrency))

    def median(mode: str, pick: Any) -> float:
        return float(statistics.median(pick(run) for run in runs[mode]))

    def cpu_per_task(run: dict[str, Any]) -> float:
        return float(run["cpu"]["all_us_per_task"])

    rate_ = {m: median(m, lambda r: r["tasks_per_s"]) for m in MODES}
    cpu = {m: median(m, cpu_per_task) for m in MODES}
    p50 = {m: median(m, lambda r: r["enqueue_to_start_ms"]["p50"]) for m in MODES}
    return {
        "params": {**runs["off"][0]["params"], "rounds": rounds},
        "tasks_per_s": {m: round(rate_[m]) for m in MODES},
        "on_to_off": round(rate_["on"] / rate_["off"], 3),
        "sampled_to_off": round(rate_["sampled"] / rate_["off"], 3),
        "cpu_us_per_task": {m: round(cpu[m], 1) for m in MODES},
        "enqueue_to_start_p50_ms": {m: round(p50[m], 2) for m in MODES},
        "runs": {
            m: [
                {
                    "tasks_per_s": r["tasks_per_s"],
                    "cpu_us_per_task": cpu_per_task(r),
                    "us_per_task_by_process": {
                        name: used.get("us_per_task")
                        for name, used in r["cpu"]["per_process"].items()
                    },
                }
                for r in runs[m]
            ]
            for m in MODES
        },
        "goal": {"on_to_off_at_least": 0.9},
    }
