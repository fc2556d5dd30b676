"""`rota bench compare`'s judgement of two sets of runs, and its argument
checks (no servers: the runs themselves are tested in tests/integration)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rota_tools.bench.compare import (
    STAGES,
    CompareError,
    Metric,
    Side,
    figure,
    parse_extra_args,
    parse_stages,
    side_args,
    snapshot,
    stage_table,
    verdict,
)

RATE = Metric("tasks/s", ("tasks_per_s",), higher_is_better=True)
LATENCY = Metric("p50 ms", ("ms", "p50"), higher_is_better=False)


def test_a_change_counts_only_when_the_ranges_do_not_overlap() -> None:
    worse = verdict(RATE, [100.0, 104.0, 98.0], [80.0, 85.0, 83.0])
    assert worse["outcome"] == "worse" and worse["outside_spread"]
    assert worse["change"] == pytest.approx((83 - 100) / 100)
    assert worse["baseline"]["median"] == 100.0 and worse["candidate"]["max"] == 85.0
    # A 10% lower median, but one run of each side lands in the other's range.
    noisy = verdict(RATE, [100.0, 120.0, 90.0], [90.0, 95.0, 80.0])
    assert noisy["outcome"] == "within noise" and not noisy["outside_spread"]
    assert verdict(RATE, [100.0, 101.0], [120.0, 125.0])["outcome"] == "better"


def test_lower_is_better_for_latencies() -> None:
    assert verdict(LATENCY, [6.0, 6.2], [3.0, 3.1])["outcome"] == "better"
    assert verdict(LATENCY, [3.0, 3.1], [6.0, 6.2])["outcome"] == "worse"


def test_one_run_a_side_is_not_judged() -> None:
    single = verdict(RATE, [100.0], [50.0])
    assert single["outcome"] == "one run: no spread" and not single["outside_spread"]


def test_figures_are_read_by_path_and_missing_ones_are_none() -> None:
    report = {"ms": {"p50": 4}, "tasks_per_s": 12.5, "text": "n/a"}
    assert figure(report, LATENCY.path) == 4.0
    assert figure(report, RATE.path) == 12.5
    assert figure(report, ("text",)) is None
    assert figure(report, ("ms", "p99")) is None
    assert figure(report, ("tasks_per_s", "deeper")) is None


def test_stage_table_shows_medians_spreads_change_and_outcome() -> None:
    figures = {"tasks/s": verdict(RATE, [10_000.0, 10_400.0], [8_000.0, 8_300.0])}
    table = stage_table("work", [RATE, LATENCY], figures, ("baseline abc", "working tree"))
    assert "| tasks/s | 10.2k (10.0k-10.4k) | 8.2k (8.0k-8.3k) | -20.1% | worse |" in table
    assert "| p50 ms | - | - | - | not reported |" in table


def test_a_figure_only_one_side_reports_is_shown_alone() -> None:
    # A figure a later commit added: the candidate's runs, no judgement.
    added = verdict(RATE, [], [900.0, 1_100.0, 1_000.0])
    assert added["outcome"] == "baseline does not report it" and added["change"] is None
    table = stage_table("work", [RATE], {"tasks/s": added}, ("baseline abc", "working tree"))
    assert "| tasks/s | - | 1.0k (900-1.1k) | - | baseline does not report it |" in table
    assert verdict(RATE, [5.0], [])["outcome"] == "candidate does not report it"


def test_stages_and_extra_arguments_are_checked() -> None:
    assert parse_stages("claim, work") == ["claim", "work"]
    with pytest.raises(CompareError, match="unknown stage"):
        parse_stages("claim,warp")
    with pytest.raises(CompareError):
        parse_stages(" , ")
    assert parse_extra_args(["claim=--seconds 10", "claim=--runs 2"]) == {
        "claim": ["--seconds", "10", "--runs", "2"]
    }
    with pytest.raises(CompareError, match="STAGE=ARGS"):
        parse_extra_args(["--seconds 10"])


def test_every_stage_reads_figures_its_scenario_reports() -> None:
    for name, stage in STAGES.items():
        assert stage.args[0] in {"enqueue", "load", "claim", "work", "end-to-end", "fleet"}, name
        assert stage.metrics, name


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_working_trees_snapshot_holds_new_files_and_leaves_the_index(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "ab@example.invalid")
    _git(repo, "config", "user.name", "ab")
    (repo / ".gitignore").write_text("scratch/\n")
    (repo / "kept.py").write_text("A = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "base")
    head = _git(repo, "rev-parse", "HEAD")
    assert snapshot(repo) == (head, head[:10])  # a clean tree is HEAD itself

    (repo / "kept.py").write_text("A = 2\n")  # changed, not staged
    (repo / "new.py").write_text("B = 1\n")  # new: a change's new module
    (repo / "scratch").mkdir()
    (repo / "scratch" / "out.txt").write_text("ignored\n")
    commit, name = snapshot(repo)
    assert name == head[:10] + "+changes" and commit != head
    assert _git(repo, "show", f"{commit}:kept.py") == "A = 2"
    assert _git(repo, "show", f"{commit}:new.py") == "B = 1"
    assert "scratch/out.txt" not in _git(repo, "ls-tree", "-r", "--name-only", commit)
    # Nothing staged, nothing stashed: the repository is as it was.
    status = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True
    ).stdout
    assert status.splitlines() == [" M kept.py", "?? new.py"]
    assert _git(repo, "stash", "list") == ""


def test_an_option_only_one_side_has_is_given_to_it_with_the_value_that_measures_as_before(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from rota_tools.bench import compare

    # This tree's bench takes it (its real help, read from a subprocess).
    here = Side("candidate", "working tree", Path(compare.__file__).parents[3])
    args = list(STAGES["load-spark"].args)
    assert compare._accepts(here, args, "--spark-warm-up-batches")
    old = Side("baseline", "old", tmp_path)
    monkeypatch.setattr(compare, "_accepts", lambda side, _a, _o: side is here)
    said: list[str] = []
    got = side_args((old, here), "load-spark", args, said.append)
    assert got == {"baseline": args, "candidate": [*args, "--spark-warm-up-batches", "0"]}
    assert said == [
        "load-spark: candidate runs with --spark-warm-up-batches 0, as the other measures"
    ]
    # Both sides have it, or the stage has no such option: the same arguments.
    monkeypatch.setattr(compare, "_accepts", lambda *_: True)
    assert side_args((old, here), "load-spark", args, said.append) == {
        "baseline": args,
        "candidate": args,
    }
    assert side_args((old, here), "claim", ["claim"], said.append) == {
        "baseline": ["claim"],
        "candidate": ["claim"],
    }
