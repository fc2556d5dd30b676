"""rota's SQL: migrations, the current schema and the named statements, as shipped files."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")


def _read(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def parse_named_blocks(text: str) -> dict[str, str]:
    """Splits a file of `-- name: NAME` blocks into {NAME: statement}."""
    parts = _NAME.split(text)
    blocks: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in blocks:
            raise ValueError(f"SQL block {name!r} is defined twice")
        blocks[name] = body.strip()
    return blocks


# Files of named blocks; names are unique across all of them.
BLOCK_FILES = ("queries.sql", "roles.sql", "bench.sql", "demo.sql")


@cache
def queries() -> dict[str, str]:
    blocks: dict[str, str] = {}
    for file in BLOCK_FILES:
        for name, text in parse_named_blocks(_read(file)).items():
            if name in blocks:
                raise ValueError(f"SQL block {name!r} is defined in two files")
            blocks[name] = text
    return blocks


def query(name: str) -> str:
    try:
        return queries()[name]
    except KeyError:
        raise KeyError(f"no SQL block named {name!r} in rota/sql/{BLOCK_FILES}") from None


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


@cache
def migrations() -> tuple[Migration, ...]:
    found = []
    for entry in resources.files(__package__).joinpath("migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return tuple(found)


def current_schema() -> str:
    """The whole schema at the newest version, for fresh databases."""
    return _read("schema.sql")
