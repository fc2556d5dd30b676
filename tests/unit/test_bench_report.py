"""`rota bench report`: the page's generated part from a folder of runs."""

from __future__ import annotations

import json
from pathlib import Path

from rota_tools.bench import report

MACHINE = {"cpus": 2, "python": "3.11.7", "platform": "Linux-x86_64"}


def _run(folder: Path, name: str, at: str, rate: float, ratio: float) -> None:
    kept = {
        "stage": "enqueue",
        "report": {
            "at": at,
            "machine": MACHINE,
            "enqueue_many_tasks_per_s": rate,
            "ratio_to_plain_pipelining": ratio,
        },
    }
    (folder / name).write_text(json.dumps(kept))


def test_the_generated_part_holds_medians_ranges_machine_and_dates(tmp_path: Path) -> None:
    _run(tmp_path, "enqueue-1.json", "2026-11-26T10:00:00+00:00", 200_000, 0.9)
    _run(tmp_path, "enqueue-2.json", "2026-11-26T11:00:00+00:00", 180_000, 0.8)
    _run(tmp_path, "enqueue-3.json", "2026-11-27T09:00:00+00:00", 210_000, 1.0)
    (tmp_path / "notes.json").write_text(json.dumps({"stage": "unknown"}))
    text = report.render(report.load_runs(tmp_path))
    assert "Measured 2026-11-26 to 2026-11-27 on 2 cores, Linux-x86_64, Python 3.11.7" in text
    assert "median of 3 runs" in text
    row = "| enqueue_many tasks/s | **200.0k** (180.0k to 210.0k) | 200.0k, 180.0k, 210.0k |"
    assert row in text
    assert "| … ÷ plain pipelined XADD | **0.9** (0.8 to 1) |" in text
    assert "### claim" not in text  # no runs of it: no table


def test_the_page_keeps_what_is_around_the_generated_part(tmp_path: Path) -> None:
    _run(tmp_path, "enqueue-1.json", "2026-11-26T10:00:00+00:00", 200_000, 0.9)
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\nWhat they are.\n\n## Method\n\nHow.\n")
    first = report.render(report.load_runs(tmp_path))
    report.write_page(page, first)
    _run(tmp_path, "enqueue-2.json", "2026-11-26T11:00:00+00:00", 100_000, 0.5)
    report.write_page(page, report.render(report.load_runs(tmp_path)))
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\n" + report.START)
    assert text.count(report.START) == 1 and text.endswith("What they are.\n\n## Method\n\nHow.\n")
    assert "**150.0k**" in text


def _end_to_end(folder: Path, name: str, workers: tuple[float, float], postgres: float) -> None:
    per_process = {
        "producer": {"us_per_task": 8.0},
        "worker_1": {"us_per_task": workers[0]},
        "worker_2": {"us_per_task": workers[1]},
        "postgresql": {"us_per_task": postgres},
    }
    kept = {
        "stage": "end-to-end",
        "report": {"machine": MACHINE, "cpu": {"per_process": per_process}},
    }
    (folder / name).write_text(json.dumps(kept))


def test_each_stage_has_a_table_of_its_processes_cpu_per_task(tmp_path: Path) -> None:
    _end_to_end(tmp_path, "end-to-end-1.json", (9.0, 10.0), 40.0)
    _end_to_end(tmp_path, "end-to-end-2.json", (11.0, 12.0), 50.0)
    _run(tmp_path, "enqueue-1.json", "2026-11-26T10:00:00+00:00", 200_000, 0.9)
    text = report.render(report.load_runs(tmp_path))
    part = text.split("## Where each microsecond of a task goes", 1)[1]
    # A stage whose runs lack the figures says so; one without runs has no table.
    enqueue = part.split("### enqueue:", 1)[1].split("###", 1)[0]
    assert "Not measured in these runs." in enqueue
    assert "### claim:" not in part
    end_to_end = part.split("### end-to-end:", 1)[1]
    # The workers' figures add up, process by process, run by run.
    assert "| workers | **21** (19 to 23) | 19, 23 |" in end_to_end
    assert "| PostgreSQL | **45** (40 to 50) | 40, 50 |" in end_to_end
    assert "| all of these | **74** (67 to 81) | 67, 81 |" in end_to_end
    assert "| loader |" not in end_to_end  # not in these runs' reports


def test_the_benchmarks_page_shows_what_the_committed_runs_render() -> None:
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "explanation" / "benchmarks.md").read_text()
    runs = root / "bench-runs"
    generated = report.render(report.load_runs(runs), report.load_comparison(runs))
    assert generated in page, "run `rota bench report` to write the page from bench-runs/"


def _e2e_report(workers: float, postgres: float, at: str) -> dict[str, object]:
    per_process = {
        "loader": {"us_per_task": 5.0},
        "worker_1": {"us_per_task": workers},
        "worker_2": {"us_per_task": workers},
        "postgresql": {"us_per_task": postgres},
    }
    return {"at": at, "machine": MACHINE, "cpu": {"per_process": per_process}}


def test_a_comparison_shows_each_process_before_and_after(tmp_path: Path) -> None:
    at = "2026-11-28T23:00:00+00:00"
    comparison = {
        "baseline": "6ac9fbb0123",
        "candidate": "9d07c41abcd",
        "rounds": 3,
        "stages": {
            "end-to-end": {
                "reports": {
                    "baseline": [_e2e_report(w, p, at) for w, p in ((10, 60), (12, 70), (11, 50))],
                    "candidate": [_e2e_report(w, p, at) for w, p in ((8, 40), (9, 45), (7, 50))],
                }
            },
            # A stage whose reports lack the CPU figures has no table.
            "enqueue": {"reports": {"baseline": [{"at": at}], "candidate": [{"at": at}]}},
        },
    }
    (tmp_path / report.COMPARISON).write_text(json.dumps(comparison))
    _run(tmp_path, "enqueue-1.json", "2026-11-26T10:00:00+00:00", 200_000, 0.9)
    text = report.render(report.load_runs(tmp_path), report.load_comparison(tmp_path))
    part = text.split("## Before and after", 1)[1]
    assert "`rota bench compare` of 6ac9fbb\n(before) and 9d07c41 (after), 3 rounds" in part
    table = part.split("### end-to-end:", 1)[1]
    # Medians of the rounds; the two workers added up, run by run.
    assert "| loader | 5 | 5 | 1 |" in table
    assert "| workers | 22 | 16 | 0.73 |" in table
    assert "| PostgreSQL | 60 | 45 | 0.75 |" in table
    assert "| all of these | 87 | 66 | 0.76 |" in table
    assert "### enqueue:" not in part
    # Without a comparison the page has no such part.
    assert "## Before and after" not in report.render(report.load_runs(tmp_path))


def _fleet(folder: Path, name: str, rota_cpu: float, stall_max: float) -> None:
    def system(cpu: float, p99: float, locks: int) -> dict[str, object]:
        return {
            "postgres_cpu_us_per_task": cpu,
            "handler_ms": {"p50": 1.0, "p99": p99, "max": 20.0},
            "achieved_per_s": 2000,
            "postgres_connections": 12,
            "wait_events": {"Lock:tuple": locks, "Lock:object": locks, "CPU": 50},
            "stall": {"handler_ms": {"max": stall_max}, "failed": 0, "lost": 0},
        }

    report = {
        "machine": MACHINE,
        "systems": {"rota": system(rota_cpu, 4.0, 0), "pgqueuer": system(900.0, 300.0, 70)},
        "ratios": {"postgres_cpu_to_best_peer": rota_cpu / 900},
    }
    (folder / name).write_text(json.dumps({"stage": "fleet", "report": report}))


def test_the_fleet_has_a_row_a_system(tmp_path: Path) -> None:
    _fleet(tmp_path, "fleet-1.json", 170.0, 6.0)
    _fleet(tmp_path, "fleet-2.json", 190.0, 6.0)
    text = report.render(report.load_runs(tmp_path))
    assert "| rota PostgreSQL CPU ÷ best peer's | **0.2** (0.189 to 0.211) |" in text
    table = text.split("### fleet, system by system", 1)[1].split("##", 1)[0]
    # Each figure's median, its range when the runs differ; Lock waits summed.
    row = "| 180 (170 to 190) | 1 | 4 | 20 | 2.0k | 12 | 0 | 6 | 0 | 0 |"
    assert f"| rota (buffer, Python loader) {row}" in table
    assert "| pgqueuer | 900 | 1 | 300 | 20 | 2.0k | 12 | 140 | 6 | 0 | 0 |" in table
    assert "procrastinate" not in table  # not in these runs
