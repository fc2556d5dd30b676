"""Every SQL block the code names exists, and every block is used."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import rota
import rota_tools
from rota.sql import (
    FUNCTION_FILES,
    Blocks,
    current_schema,
    function_files,
    migrations,
    parse_named_blocks,
    queries,
)
from rota_tools.sql import BLOCKS as TOOL_BLOCKS

USE = re.compile(r"""\bquery\(\s*["'](\w+)["']\s*\)""")
PACKAGES = [
    (Path(rota.__file__).parent, queries()),
    (Path(rota_tools.__file__).parent, TOOL_BLOCKS.by_name),
]


def _names_used(package: Path) -> set[str]:
    used: set[str] = set()
    for source in package.rglob("*.py"):
        used.update(USE.findall(source.read_text()))
    return used


@pytest.mark.parametrize(("package", "blocks"), PACKAGES, ids=["rota", "rota_tools"])
def test_every_block_used_in_code_exists(package: Path, blocks: dict[str, str]) -> None:
    missing = _names_used(package) - set(blocks)
    assert not missing, f"query() names without a block in {package.name}/sql: {missing}"


@pytest.mark.parametrize(("package", "blocks"), PACKAGES, ids=["rota", "rota_tools"])
def test_every_block_is_used(package: Path, blocks: dict[str, str]) -> None:
    unused = set(blocks) - _names_used(package)
    assert not unused, f"blocks in {package.name}/sql that no code uses: {unused}"


def test_a_name_is_defined_once_across_files() -> None:
    assert isinstance(TOOL_BLOCKS, Blocks)
    assert not set(queries()) & set(TOOL_BLOCKS.by_name)


def test_blocks_parse_and_refuse_duplicates() -> None:
    text = "-- name: one\nSELECT 1\n\n-- name: two\n-- a comment\nSELECT 2\n"
    assert parse_named_blocks(text) == {"one": "SELECT 1", "two": "-- a comment\nSELECT 2"}
    with pytest.raises(ValueError, match="twice"):
        parse_named_blocks("-- name: one\nSELECT 1\n-- name: one\nSELECT 2\n")


def test_migrations_are_numbered_without_gaps() -> None:
    assert [m.version for m in migrations()] == list(range(1, len(migrations()) + 1))


def test_migrations_neither_make_nor_call_functions() -> None:
    """A migration runs while the previous release's functions are in place
    (rota.core.migrate): it holds table, type, index and data statements, and
    the drops a changed function needs; functions live in functions/ alone."""
    for m in migrations():
        text = re.sub(r"^DROP FUNCTION IF EXISTS [^;]*;", "", m.sql, flags=re.MULTILINE)
        found = re.search(r"\b(FUNCTION|PROCEDURE|TRIGGER)\b|^DO\b|\$\w*\$|rota\.\w+\(", text, re.M)
        assert not found, f"{m.name}: {found[0] if found else ''}"


def test_rota_sql_is_at_most_half_of_its_lines_before_the_baseline() -> None:
    """10,469 lines of SQL before migrations 0001-0047 were cut to their
    table steps; their function bodies stay out of the tree."""
    root = Path(rota.__file__).parent / "sql"
    lines = sum(len(p.read_text().splitlines()) for p in root.rglob("*.sql"))
    assert lines <= 10_469 // 2


FUNCTION_HEADER = re.compile(
    r"^CREATE OR REPLACE FUNCTION (rota\.\w+)\((.*?)^(?:AS )?.*?\$\w*\$", re.DOTALL | re.MULTILINE
)


def test_every_function_is_defined_once_in_a_file_applied_again() -> None:
    """A function lives in one file of functions/, made with CREATE OR REPLACE
    (a file is applied again over what it made); schema.sql holds none."""
    assert not re.search(r"^CREATE (OR REPLACE )?(FUNCTION|TRIGGER)", current_schema(), re.M)
    texts = [file.sql for file in function_files()]
    assert [f.name for f in function_files()] == [f"functions/{n}" for n in FUNCTION_FILES]
    for text in texts:
        assert not re.search(r"^CREATE (FUNCTION|TRIGGER|VIEW)", text, re.MULTILINE)
    names = [m[1] for text in texts for m in FUNCTION_HEADER.finditer(text)]
    assert len(names) > 70
    assert sorted(names) == sorted(set(names)), "a function is defined twice"


def test_definer_functions_state_their_search_path() -> None:
    """CREATE OR REPLACE resets a function's settings: a definer function's
    file states its fixed search_path."""
    headers = [m[0] for file in function_files() for m in FUNCTION_HEADER.finditer(file.sql)]
    definers = [h for h in headers if "SECURITY DEFINER" in h]
    assert definers
    for header in definers:
        assert "SET search_path = pg_catalog, pg_temp" in header, header
