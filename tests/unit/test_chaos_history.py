"""The chaos suites' history check of completions, on histories made up here."""

from __future__ import annotations

from rota_tools.bench.faults import Run, completion_history


def test_the_last_attempt_kept_is_clean_and_the_earlier_run_is_counted_superseded() -> None:
    # Attempt 1 ran on a worker cut off past its lease; attempt 2 ran
    # elsewhere and its completion is the one kept.
    runs = [Run("a", "t1", 1, 101, 10.0, 10.5), Run("a", "t1", 2, 102, 22.0, 22.1)]
    stale, superseded = completion_history({"a": 2}, runs)
    assert stale == []
    assert superseded == 1


def test_a_completion_kept_from_a_superseded_attempt_is_reported_with_its_runs() -> None:
    runs = [
        Run("a", "t1", 1, 101, 10.0, 30.0),
        Run("a", "t1", 2, 102, 22.0, 22.1),
        Run("b", "t2", 1, 101, 11.0, 11.1),
    ]
    stale, superseded = completion_history({"a": 1, "b": 1}, runs)
    assert stale == [
        {"task": "a", "accepted_attempt": 1, "runs": [(1, 101, 10.0, 30.0), (2, 102, 22.0, 22.1)]}
    ]
    assert superseded == 0


def test_tasks_not_finished_are_left_to_the_lost_check() -> None:
    stale, superseded = completion_history({}, [Run("a", "t1", 1, 101, 10.0, 10.5)])
    assert (stale, superseded) == ([], 0)
