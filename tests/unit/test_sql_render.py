"""The functions made of named parts (rota/sql/parts/) are committed as
rendered (rota/sql/render.py), and no function is put together at run time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rota.sql import FUNCTION_FILES
from rota.sql.render import (
    FUNCTIONS,
    GENERATED,
    SQL,
    Case,
    Cases,
    Renderer,
    parse_parts,
    part,
    render,
    rendered,
)


def test_rendered_files_are_as_committed() -> None:
    stale = [
        path.name
        for path, text in rendered().items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    assert not stale, (
        f"rota/sql/functions/ {stale} differ from what their parts make:"
        " run `make sql` and commit both"
    )


def test_every_generated_file_has_a_recipe_and_is_applied() -> None:
    generated = {
        path.name
        for path in (SQL / "functions").glob("*.sql")
        if path.read_text(encoding="utf-8").startswith(GENERATED)
    }
    assert generated == {f.file for f in FUNCTIONS}
    assert generated <= set(FUNCTION_FILES)


def test_a_rendered_file_makes_one_function() -> None:
    for function in FUNCTIONS:
        text = render(function)
        assert len(re.findall(r"^CREATE OR REPLACE FUNCTION ", text, re.M)) == 1, function.file
        assert "{{" not in text, function.file


def test_each_claim_case_runs_its_statement_under_its_comment() -> None:
    text = (SQL / "functions" / "claim.sql").read_text(encoding="utf-8")
    branches = re.findall(
        r"^    (?:IF|ELSIF|ELSE)\b.*\n"
        r"        -- (\w+): .*\n(?:        -- .*\n)*"
        r"        RETURN QUERY\n",
        text,
        re.M,
    )
    assert branches == [
        "first_in_line",
        "tenant_limits",
        "key_limits",
        "priority",
        "priority_and_key_limits",
    ]
    assert text.count("RETURN QUERY") == 5


def _sources() -> list[Path]:
    return sorted(SQL.rglob("*.sql"))


BUILT_BY_FORMAT = re.compile(
    r"EXECUTE\s+format\s*\(\s*(?:\$\w*\$|')\s*CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION", re.I
)
POSITIONAL = re.compile(r"%\d+\$[sIL]")
DO_BLOCK = re.compile(r"^DO\s+(\$\w*\$)(.*?)\1", re.M | re.S)
CREATE_FUNCTION = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION", re.I)


def _builds_functions_at_run_time(text: str) -> list[str]:
    found = [m[0] for m in BUILT_BY_FORMAT.finditer(text)]
    found += [m[0] for m in POSITIONAL.finditer(text)]
    found += [m[1] for m in DO_BLOCK.finditer(text) if CREATE_FUNCTION.search(m[2])]
    return found


def test_no_function_is_put_together_at_run_time() -> None:
    """Every function's text is in a file as it runs: none is made by a DO
    block's EXECUTE, nor from positional parts (`%1$s`)."""
    assert len(_sources()) > 20
    for path in _sources():
        found = _builds_functions_at_run_time(path.read_text(encoding="utf-8"))
        assert not found, f"{path.relative_to(SQL)} puts a function together: {found}"


def test_the_check_finds_a_function_made_by_a_do_block() -> None:
    made = (
        "DO $make$\nDECLARE\n    v_part constant text := $part$ SELECT 1%1$s $part$;\n"
        "BEGIN\n    EXECUTE format($function$\nCREATE OR REPLACE FUNCTION rota.f()"
        " RETURNS int LANGUAGE sql AS $body$%s$body$$function$, v_part);\nEND\n$make$;\n"
    )
    assert len(_builds_functions_at_run_time(made)) == 3
    assert not _builds_functions_at_run_time(
        "DO $own$\nBEGIN\n    EXECUTE format('ALTER FUNCTION %s OWNER TO rota_owner', 'f');\n"
        "END\n$own$;\n"
    )


PARTS = """\
-- The file's own comment.

-- name: outer
-- What it is: not rendered.
SELECT a{{more}}
FROM t
{{where}}
ORDER BY a

-- name: where
-- A condition.
WHERE a > {{least}}


-- name: more
, b
"""


def test_parts_keep_their_description_apart() -> None:
    parts = parse_parts(PARTS)
    assert parts["outer"].about == "-- What it is: not rendered."
    assert parts["outer"].text == "SELECT a{{more}}\nFROM t\n{{where}}\nORDER BY a"
    assert parts["where"].text == "WHERE a > {{least}}"
    with pytest.raises(ValueError, match="twice"):
        parse_parts("-- name: one\nSELECT 1\n-- name: one\nSELECT 2\n")


def test_slots_take_lines_or_words() -> None:
    renderer = Renderer(parse_parts(PARTS))
    made = part("outer", more=part("more"), where=part("where", least="1"))
    assert renderer.text(made) == "SELECT a, b\nFROM t\nWHERE a > 1\nORDER BY a"
    assert renderer.text(part("outer", more="", where=None)) == "SELECT a\nFROM t\nORDER BY a"
    with pytest.raises(KeyError, match="not filled"):
        renderer.text(part("outer", more=""))
    with pytest.raises(KeyError, match="no slots"):
        renderer.text(part("outer", more="", where=None, other="x"))
    with pytest.raises(TypeError, match="where lines go"):
        renderer.text(part("outer", more="", where="WHERE true"))
    with pytest.raises(KeyError, match="no part named"):
        renderer.text(part("missing"))


def test_cases_render_as_one_branch_each() -> None:
    renderer = Renderer(parse_parts(PARTS))
    statement = part("outer", more="", where=None)
    cases = Cases(
        part("where", least="0"),
        [Case("few", "v_few", "when few.", [statement]), Case("many", None, "else.", [statement])],
    )
    assert renderer.cases(cases) == (
        "WHERE a > 0\n"
        "    IF v_few THEN\n        -- few: when few.\n"
        "        RETURN QUERY\nSELECT a\nFROM t\nORDER BY a;\n"
        "    ELSE\n        -- many: else.\n"
        "        RETURN QUERY\nSELECT a\nFROM t\nORDER BY a;\n"
        "    END IF;"
    )
    with pytest.raises(ValueError, match="not the last"):
        renderer.cases(Cases(cases.probe, list(reversed(cases.cases))))
