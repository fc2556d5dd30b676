"""`rota --help` and every group's help read as sentences: a docstring's
hard line wraps do not break the panels' lines (each command's summary is
one line when the terminal is wide enough for it)."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from rota.cli import app as cli


def _groups() -> list[list[str]]:
    root = typer.main.get_command(cli)
    found: list[list[str]] = [[]]

    def walk(command: object, path: list[str]) -> None:
        # Typer may bring its own click: groups are known by their commands.
        for name, sub in getattr(command, "commands", {}).items():
            if hasattr(sub, "commands"):
                found.append([*path, name])
                walk(sub, [*path, name])

    walk(root, [])
    return found


@pytest.mark.parametrize("path", _groups(), ids=lambda p: " ".join(p) or "rota")
def test_each_commands_summary_is_one_line_on_a_wide_terminal(path: list[str]) -> None:
    done = CliRunner().invoke(cli, [*path, "--help"], env={"COLUMNS": "400", "TERM": "dumb"})
    assert done.exit_code == 0, done.output
    panel = done.output.split("Commands")[1]
    rows = [line.strip("│ ").rstrip() for line in panel.splitlines()[1:] if line.startswith("│")]
    # A row either starts with a command's name or is a continuation.
    continuations = [row for row in rows if re.match(r"^\s", row.strip("│")) or not row]
    names = [row.split()[0] for row in rows if row]
    assert len(names) == len(set(names)), rows
    assert not continuations, rows


def test_reaper_is_a_hidden_deprecated_alias_of_maintenance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rota.consumer.maintenance as maintenance

    ran: list[object] = []
    monkeypatch.setattr(maintenance, "run_maintenance", lambda *args: ran.append(args))
    listed = CliRunner().invoke(cli, ["--help"], env={"COLUMNS": "400", "TERM": "dumb"})
    assert " maintenance " in listed.output and " reaper " not in listed.output
    done = CliRunner().invoke(
        cli, ["reaper", "--database-url", "postgresql://nowhere/db"], env={"TERM": "dumb"}
    )
    assert done.exit_code == 0, done.output
    assert "rota reaper is deprecated: run `rota maintenance`" in done.output
    assert len(ran) == 1


def test_rota_worker_has_the_workers_own_defaults() -> None:
    """`rota worker` and `manage.py rota_worker` start a worker the same way
    (rota.consumer.main.serve_worker), with its defaults."""
    import inspect

    from rota.cli.consumer import worker
    from rota.consumer.main import serve_worker

    ours = inspect.signature(serve_worker).parameters
    for name, parameter in inspect.signature(worker).parameters.items():
        if name in ours and parameter.default is not inspect.Parameter.empty:
            default = getattr(parameter.default, "value", parameter.default)  # an enum's
            assert default == ours[name].default, name
