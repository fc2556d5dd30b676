"""`rota --help` and every group's help read as sentences: a docstring's
hard line wraps do not break the command list's lines (each command's
summary is one line when the terminal is wide enough for it); and every
command's help reads in an 80-column terminal: plain help, whose option
help wraps in a column of its own, wide enough for sentences."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from rota.cli import app as cli


def _commands(groups: bool) -> list[list[str]]:
    """The paths of the groups (with `groups`) or of the leaf commands."""
    root = typer.main.get_command(cli)
    found: list[list[str]] = [[]] if groups else []

    def walk(command: object, path: list[str]) -> None:
        # Typer may bring its own click: groups are known by their commands.
        for name, sub in getattr(command, "commands", {}).items():
            if hasattr(sub, "commands"):
                if groups:
                    found.append([*path, name])
                walk(sub, [*path, name])
            elif not groups:
                found.append([*path, name])

    walk(root, [])
    return found


def _help(path: list[str], columns: int) -> str:
    done = CliRunner().invoke(cli, [*path, "--help"], env={"COLUMNS": str(columns), "TERM": "dumb"})
    assert done.exit_code == 0, done.output
    return done.output


@pytest.mark.parametrize("path", _commands(groups=True), ids=lambda p: " ".join(p) or "rota")
def test_each_commands_summary_is_one_line_on_a_wide_terminal(path: list[str]) -> None:
    section = _help(path, 400).split("\nCommands:\n")[1]
    rows = [line for line in section.splitlines() if line.strip()]
    # A row starts with a command's name (indented by two); a continuation
    # would be indented further.
    continuations = [row for row in rows if re.match(r"^\s{3,}", row)]
    names = [row.split()[0] for row in rows]
    assert len(names) == len(set(names)), rows
    assert not continuations, rows


@pytest.mark.parametrize("path", _commands(groups=False), ids=" ".join)
def test_each_commands_help_reads_in_80_columns(path: list[str]) -> None:
    text = _help(path, 80)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "│" not in text  # no panels, whose columns leave option help a few words wide
    options = text.split("\nOptions:\n")[1]
    # Each option's help starts in a column with room for sentences: a
    # line's help text begins at most 34 characters in.
    starts = []
    for line in options.splitlines():
        option = re.match(r"^ {2}-\S.*?\s{2,}(?=\S)", line)
        if option is not None:
            starts.append(option.end())
        elif line.startswith(" " * 5):  # a continuation of an option's help
            starts.append(len(line) - len(line.lstrip()))
    assert starts and max(starts) <= 34, text


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
