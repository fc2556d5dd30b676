"""Every SQL block the code names exists, and every block is used."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import rota
from rota.sql import migrations, parse_named_blocks, queries

PACKAGE = Path(rota.__file__).parent
USE = re.compile(r"""\bquery\(\s*["'](\w+)["']\s*\)""")


def _names_used() -> set[str]:
    used: set[str] = set()
    for source in PACKAGE.rglob("*.py"):
        used.update(USE.findall(source.read_text()))
    return used


def test_every_block_used_in_code_exists() -> None:
    missing = _names_used() - set(queries())
    assert not missing, f"query() names without a block in queries.sql: {missing}"


def test_every_block_is_used() -> None:
    unused = set(queries()) - _names_used()
    assert not unused, f"blocks in queries.sql that no code uses: {unused}"


def test_blocks_parse_and_refuse_duplicates() -> None:
    text = "-- name: one\nSELECT 1\n\n-- name: two\n-- a comment\nSELECT 2\n"
    assert parse_named_blocks(text) == {"one": "SELECT 1", "two": "-- a comment\nSELECT 2"}
    with pytest.raises(ValueError, match="twice"):
        parse_named_blocks("-- name: one\nSELECT 1\n-- name: one\nSELECT 2\n")


def test_migrations_are_numbered_without_gaps() -> None:
    assert [m.version for m in migrations()] == list(range(1, len(migrations()) + 1))
