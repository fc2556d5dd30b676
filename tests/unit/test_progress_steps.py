"""Progress steps of `rota archive` and `rota loader drain`: done counted
absolutely, time left from the fraction done where the total is not counted
in the same units, other counts beside; and the terminal's bar goes to
stderr only."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from rota.cli.output import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _timed(progress: Progress) -> Clock:
    clock = Clock()
    progress._clock = clock
    progress.started = clock.now
    return clock


def test_time_left_from_the_fraction_done(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress("archiving tasks", as_json=True)
    clock = _timed(progress)
    clock.now += 10
    progress.show(400, fraction=0.25, hours_read=1, hours=4)
    clock.now += 30
    progress.show(1_600, fraction=1.0, hours_read=4, hours=4)
    progress.close()
    out, err = capsys.readouterr()
    assert out == ""
    first, last = (json.loads(line) for line in err.splitlines())
    assert first == {
        "progress": "archiving tasks",
        "done": 400,
        "per_second": 40.0,
        "seconds": 10.0,
        "fraction": 0.25,
        "seconds_left": 30.0,
        "hours_read": 1,
        "hours": 4,
    }
    assert (last["done"], last["seconds_left"], last["per_second"]) == (1_600, 0, 40.0)


def test_a_total_gives_the_time_left_and_no_total_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    counted = Progress("draining the buffer", as_json=True, total=100)
    clock = _timed(counted)
    clock.now += 5
    counted.show(20, loaded=200)
    unknown = Progress("draining the buffer", as_json=True)
    _timed(unknown).now += 5
    unknown.show(20)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert (lines[0]["seconds_left"], lines[0]["fraction"], lines[0]["loaded"]) == (20.0, 0.2, 200)
    assert "seconds_left" not in lines[1] and "total" not in lines[1]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_a_bar_on_stderr_that_leaves_no_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    err, out = Terminal(), Terminal()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr("sys.stdout", out)
    progress = Progress("draining the buffer", as_json=False, total=10)
    progress.show(4, loaded=40)
    bar: Any = progress._bar
    task = bar.tasks[0]
    assert (task.completed, task.total) == (400, 1000)
    assert "4 of 10" in task.fields["counts"] and "loaded 40" in task.fields["counts"]
    progress.close()
    assert out.getvalue() == ""
    assert "draining the buffer" in err.getvalue()
    assert "{" not in err.getvalue()  # no JSON lines off --json
