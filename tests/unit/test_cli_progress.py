"""Progress of long commands: JSON lines on stderr with --json (stdout keeps
the result), nothing when stderr is not a terminal."""

from __future__ import annotations

import json

import pytest

from rota.cli.output import Progress


def test_json_lines_say_done_rate_and_time_left(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress("pruning tasks", as_json=True, total=30)
    progress.advance(10, "finished")
    progress.advance(5, "dead")
    progress.close()
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in err.splitlines()]
    assert out == ""
    assert [(x["done"], x["stage"], x["total"]) for x in lines] == [
        (10, "finished", 30),
        (15, "dead", 30),
    ]
    assert all(x["per_second"] > 0 and x["seconds_left"] >= 0 for x in lines)


def test_quiet_when_not_on_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress("pruning tasks", as_json=False)
    progress.advance(10)
    progress.close()
    assert capsys.readouterr() == ("", "")
