"""Renders the functions made of named parts: `make sql`, or
`python -m rota.sql.render`.

rota.claim's five cases, the completions and the load's placement share
statements' parts. Each part is written once, as a `-- name: NAME` block of a
file of rota/sql/parts/; the recipe below says of which parts each function
is made, and each is rendered to its own file of rota/sql/functions/, which
`rota migrate` applies as it applies the others: what runs, each case written
out whole. To change a statement, edit its part (or the recipe), run
`make sql`, and commit both; tests/unit/test_sql_render.py fails while a
rendered file differs from what its parts make.

In a part, `{{slot}}` alone on its line stands for lines (a part, parts, a
probe and its cases, or none); within a line, for words (a word, or a part).
"""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SQL = Path(__file__).parent
_NAME_LINE = re.compile(r"-- name: (\w+)\s*")
_SLOT = re.compile(r"\{\{(\w+)\}\}")


@dataclass(frozen=True)
class Text:
    """A part as written: its description (the comment lines after its
    name) and its text."""

    about: str
    text: str


def parse_parts(source: str) -> dict[str, Text]:
    """The parts of a file of parts/: each from its `-- name:` line to the
    next, its leading comment lines its description, blank lines at its end
    left out."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in source.split("\n"):
        match = _NAME_LINE.fullmatch(line)
        if match:
            if match[1] in found:
                raise ValueError(f"part {match[1]!r} is defined twice")
            current = found[match[1]] = []
        elif current is not None:
            current.append(line)
    parts = {}
    for name, lines in found.items():
        about = 0
        while about < len(lines) and lines[about].startswith("--"):
            about += 1
        end = len(lines)
        while end > about and not lines[end - 1].strip():
            end -= 1
        parts[name] = Text("\n".join(lines[:about]), "\n".join(lines[about:end]))
    return parts


@dataclass(frozen=True)
class Part:
    """A part, by name, with what fills its slots."""

    name: str
    slots: Mapping[str, Fill]


@dataclass(frozen=True)
class Case:
    """One of a function's statements: its name, when it runs (a PL/pgSQL
    condition; None: in every other case), a comment saying so, and its
    parts in order."""

    name: str
    when: str | None
    comment: str
    parts: Sequence[Part]


@dataclass(frozen=True)
class Cases:
    """A probe, then the statement of the first case whose condition holds."""

    probe: Part
    cases: Sequence[Case]


Fill = Part | Sequence[Part] | Cases | str | None


def part(name: str, **slots: Fill) -> Part:
    return Part(name, slots)


@dataclass(frozen=True)
class Function:
    """A function's file of functions/, made of the parts of a file of
    parts/: its function's part, its slots filled."""

    file: str
    parts: str
    function: Part


class Renderer:
    def __init__(self, parts: Mapping[str, Text]) -> None:
        self.parts = parts

    def text(self, made: Part) -> str:
        try:
            written = self.parts[made.name]
        except KeyError:
            raise KeyError(f"no part named {made.name!r}") from None
        used: set[str] = set()

        def filled(slot: str) -> Fill:
            if slot not in made.slots:
                raise KeyError(f"part {made.name!r}: slot {{{{{slot}}}}} is not filled")
            used.add(slot)
            return made.slots[slot]

        lines = []
        for line in written.text.split("\n"):
            whole = _SLOT.fullmatch(line)
            if whole:
                rendered = self.lines(filled(whole[1]))
                if rendered is not None:
                    lines.append(rendered)
            else:
                lines.append(_SLOT.sub(lambda m: self.words(filled(m[1])), line))
        if unused := set(made.slots) - used:
            raise KeyError(f"part {made.name!r} has no slots {sorted(unused)}")
        return "\n".join(lines)

    def lines(self, fill: Fill) -> str | None:
        if fill is None:
            return None
        if isinstance(fill, Part):
            return self.text(fill)
        if isinstance(fill, Cases):
            return self.cases(fill)
        if isinstance(fill, str):
            raise TypeError(f"words {fill!r} where lines go")
        return "\n".join(self.text(p) for p in fill)

    def words(self, fill: Fill) -> str:
        if isinstance(fill, str):
            return fill
        if isinstance(fill, Part):
            return self.text(fill)
        raise TypeError(f"{fill!r} within a line")

    def cases(self, made: Cases) -> str:
        lines = [self.text(made.probe)]
        for n, case in enumerate(made.cases):
            if case.when is None:
                if n != len(made.cases) - 1:
                    raise ValueError(f"case {case.name!r} without a condition is not the last")
                lines.append("    ELSE")
            else:
                lines.append(f"    {'ELSIF' if n else 'IF'} {case.when} THEN")
            comment = textwrap.wrap(f"{case.name}: {case.comment}", 76)
            lines.extend(f"        -- {line}" for line in comment)
            statement = "\n".join(self.text(p) for p in case.parts)
            lines.append(f"        RETURN QUERY\n{statement};")
        lines.append("    END IF;")
        return "\n".join(lines)


def _claim(outcome: str) -> Cases:
    """rota.claim's probe and cases; `outcome`: the columns a completion's
    claim adds to each row."""

    def candidates(skip_tenants: Part | None, columns: str = "") -> Part:
        return part("candidates", skip_tenants=skip_tenants, columns=columns)

    def taken(rows: str, *, keyed: bool) -> Part:
        return part("taken", rows=rows, limit_key=", t.limit_key" if keyed else "")

    def leased(rows: str, *, keyed: bool) -> Part:
        return part("leased", rows=rows, key_id=", key_id" if keyed else "", outcome=outcome)

    admitted = part("admitted", candidates=candidates(part("blocked")))
    return Cases(
        part("claim_probe"),
        [
            Case(
                "first_in_line",
                "NOT v_urgent AND NOT v_keys AND NOT v_limited",
                "no urgent or keyed task in these queues, no tenant limited or paused"
                " (most claims): the first tasks in line, as they come.",
                [
                    part("first_in_line", candidates=candidates(None, ", false AS counted")),
                    taken("admitted", keyed=False),
                    leased("claimed", keyed=False),
                ],
            ),
            Case(
                "tenant_limits",
                "NOT v_urgent AND NOT v_keys",
                "some tenant limited or paused, no urgent or keyed task in these queues:"
                " the first tasks in line that their tenants' limits admit.",
                [
                    admitted,
                    taken("admitted", keyed=False),
                    part("charged", rows="claimed"),
                    leased("claimed", keyed=False),
                ],
            ),
            Case(
                "key_limits",
                "NOT v_urgent",
                "keyed tasks in these queues, no urgent one: the tasks that their"
                " tenants' limits admit, then those that fit their keys' limits.",
                [
                    admitted,
                    taken("admitted", keyed=True),
                    part("key_stage"),
                    part("charged", rows="final"),
                    leased("final", keyed=True),
                ],
            ),
            Case(
                "priority",
                "NOT v_keys",
                "an urgent task in these queues, no keyed one: the tasks that their"
                " tenants' limits admit, a tenant's urgent tasks taking its slots.",
                [
                    admitted,
                    part("priority"),
                    taken("picked", keyed=False),
                    part("charged", rows="claimed"),
                    leased("claimed", keyed=False),
                ],
            ),
            Case(
                "priority_and_key_limits",
                None,
                "urgent and keyed tasks in these queues: the tasks that their tenants'"
                " limits admit, a tenant's urgent tasks taking its slots, then those"
                " that fit their keys' limits.",
                [
                    admitted,
                    part("priority"),
                    taken("picked", keyed=True),
                    part("key_stage"),
                    part("charged", rows="final"),
                    leased("final", keyed=True),
                ],
            ),
        ],
    )


def _complete_then_claim(completion: str) -> Part:
    return part(
        "complete_then_claim",
        completion=completion,
        claim=_claim(outcome=", NULL::integer, NULL::boolean"),
    )


def _take_rows(lean_only: Part | None) -> Part:
    """A completion's taking of its tasks' running rows, each with the
    worker's measures of its run (seconds from its claim to its start, and
    run)."""
    return part(
        "take_rows",
        lean_only=lean_only,
        reported="unnest(p_ids, p_attempts, p_started, p_ran) AS x(id, attempt, started, ran)",
        times=", x.started, x.ran",
    )


def _completion(lean_returns: Part, whole_returns: Part) -> Part:
    """A completion: the lean statement, then the whole one for what it left."""
    return part(
        "completion",
        acting_worker=part("acting_worker"),
        lean=[_take_rows(part("lean_only")), part("stored", rows="taken")],
        lean_returns=lean_returns,
        whole=[
            _take_rows(None),
            part("uncount"),
            part("done_rows"),
            part("stored", rows="done"),
            part("release"),
        ],
        whole_returns=whole_returns,
    )


def _placing(function: str, source: Part, pending_only: Part | None) -> Part:
    """A function that puts tasks in line: its pairs' variables, the pairs
    and the placement, all of the same tasks."""
    return part(
        function,
        pair_variables=part("pair_variables"),
        pairs=part("pairs", source=source, pending_only=pending_only),
        placement=part("placement", source=source, pending_only=pending_only),
    )


FUNCTIONS = (
    Function("claim.sql", "claim.sql", part("claim", claim=_claim(outcome=""))),
    Function(
        "complete_claim.sql",
        "claim.sql",
        part(
            "complete_claim",
            complete_then_claim=_complete_then_claim(
                "rota.complete_counted(p_ids, p_attempts, p_started, p_ran)"
            ),
        ),
    ),
    Function(
        "complete_keeping_claim.sql",
        "claim.sql",
        part(
            "complete_keeping_claim",
            complete_then_claim=_complete_then_claim(
                "rota.complete_keeping(p_ids, p_attempts, p_values, p_refused, p_ttls,"
                " p_started, p_ran)"
            ),
        ),
    ),
    Function(
        "take_running.sql",
        "reports.sql",
        part(
            "take_running",
            acting_worker=part("acting_worker"),
            take=[
                part(
                    "take_rows",
                    lean_only=None,
                    reported="unnest(p_ids, p_attempts) AS x(id, attempt)",
                    times="",
                ),
                part("uncount"),
            ],
        ),
    ),
    Function(
        "complete_counted.sql",
        "reports.sql",
        part(
            "complete_counted",
            completion=_completion(part("completed_uncounted"), part("completed_counted")),
        ),
    ),
    Function(
        "complete.sql",
        "reports.sql",
        part("complete", completion=_completion(part("completed"), part("completed"))),
    ),
    Function("enter_line.sql", "line.sql", _placing("enter_line", part("given_tasks"), None)),
    Function(
        "tasks_enter_line.sql",
        "line.sql",
        _placing("tasks_enter_line", part("loaded_tasks"), part("pending_first_attempts")),
    ),
)

GENERATED = "-- Generated by `make sql` (python -m rota.sql.render)"


def render(function: Function) -> str:
    """The text of a function's file."""
    source = SQL / "parts" / function.parts
    written = Renderer(parse_parts(source.read_text(encoding="utf-8")))
    about = written.parts[function.function.name].about
    return (
        f"{GENERATED} from the parts in\n"
        f"-- rota/sql/parts/{function.parts}, as the recipe in rota/sql/render.py\n"
        "-- composes them: edit those and render again, not this file.\n"
        "--\n"
        f"{about}\n{written.text(function.function)}\n"
    )


def rendered() -> dict[Path, str]:
    """Every rendered file, by its path."""
    return {SQL / "functions" / f.file: render(f) for f in FUNCTIONS}


def main() -> None:
    for path, text in rendered().items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"rendered {path.relative_to(SQL.parent.parent)}", file=sys.stderr)


if __name__ == "__main__":
    main()
