"""rota's SQL as shipped files: migrations, the current schema, the
functions (functions/, some rendered from the parts in parts/ by
rota.sql.render), and named statements in `-- name: NAME` blocks, one file
per audience."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")


def parse_named_blocks(text: str) -> dict[str, str]:
    """Splits a file of `-- name: NAME` blocks into {NAME: statement}."""
    parts = _NAME.split(text)
    blocks: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in blocks:
            raise ValueError(f"SQL block {name!r} is defined twice")
        blocks[name] = body.strip()
    return blocks


class Blocks:
    """The named blocks of some `.sql` files of a package; a name is unique
    across them."""

    def __init__(self, package: str, files: Sequence[str]) -> None:
        self.package = package
        self.files = tuple(files)

    @cached_property
    def by_name(self) -> dict[str, str]:
        blocks: dict[str, str] = {}
        for file in self.files:
            text = resources.files(self.package).joinpath(file).read_text(encoding="utf-8")
            for name, statement in parse_named_blocks(text).items():
                if name in blocks:
                    raise ValueError(f"SQL block {name!r} is defined in two files")
                blocks[name] = statement
        return blocks

    def query(self, name: str) -> str:
        try:
            return self.by_name[name]
        except KeyError:
            raise KeyError(f"no SQL block named {name!r} in {self.package}: {self.files}") from None


# The queue core's statements, by audience (rota/core/ has a module for each).
BLOCKS = Blocks(
    __package__,
    ("load.sql", "work.sql", "maintain.sql", "admin.sql", "read.sql", "migrate.sql", "roles.sql"),
)


def queries() -> dict[str, str]:
    return BLOCKS.by_name


def query(name: str) -> str:
    return BLOCKS.query(name)


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
    """The schema's tables, types and indexes at the newest version, for fresh
    databases; the functions come from `function_files`."""
    return resources.files(__package__).joinpath("schema.sql").read_text(encoding="utf-8")


# The files of functions/ in the order they are applied: each after those it
# needs (a LANGUAGE sql body is checked against the functions it calls when
# it is made; views and triggers name theirs). Some are rendered from the
# parts in parts/ (rota.sql.render, `make sql`): one function each.
FUNCTION_FILES = (
    "line.sql",
    "enter_line.sql",
    "tasks_enter_line.sql",
    "limits.sql",
    "claim.sql",
    "take_running.sql",
    "complete_counted.sql",
    "complete.sql",
    "reports.sql",
    "complete_claim.sql",
    "results.sql",
    "complete_keeping_claim.sql",
    "workflows.sql",
    "workers.sql",
    "progress.sql",
    "retention.sql",
    "operations.sql",
    "stats.sql",
    "views.sql",
    "triggers.sql",
)


@dataclass(frozen=True)
class FunctionFile:
    """A file of functions/, applied again whenever its text changes."""

    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@cache
def function_files() -> tuple[FunctionFile, ...]:
    folder = resources.files(__package__).joinpath("functions")
    found = sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".sql"))
    if found != sorted(FUNCTION_FILES):
        raise RuntimeError(f"functions/ holds {found}, FUNCTION_FILES names {FUNCTION_FILES}")
    return tuple(
        FunctionFile(f"functions/{name}", folder.joinpath(name).read_text(encoding="utf-8"))
        for name in FUNCTION_FILES
    )


@dataclass(frozen=True)
class SchemaVersion:
    """A line of schema_versions.txt: a version of the schema (its tables,
    migrations and functions, `sql_checksum`), and the oldest version whose
    processes still run on it (older functions' forms are kept for them)."""

    version: int
    supports_from: int
    checksum: str


def sql_checksum() -> str:
    """The checksum of the SQL a database is made of: schema.sql, the
    migrations, the function files, in order, and the roles' grants."""
    digest = hashlib.sha256(current_schema().encode())
    roles = resources.files(__package__).joinpath("roles.sql").read_text(encoding="utf-8")
    digest.update(b"\0roles.sql\0" + roles.encode())
    for m in migrations():
        digest.update(f"\0{m.version}\0".encode() + m.sql.encode())
    for file in function_files():
        digest.update(f"\0{file.name}\0".encode() + file.sql.encode())
    return digest.hexdigest()


@cache
def schema_versions() -> tuple[SchemaVersion, ...]:
    """The ledger of schema versions, oldest first: a new line whenever the
    SQL of `sql_checksum` changes (tests/unit/test_schema_versions.py)."""
    text = resources.files(__package__).joinpath("schema_versions.txt").read_text(encoding="utf-8")
    found = []
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            version, supports_from, checksum = line.split()
            found.append(SchemaVersion(int(version), int(supports_from), checksum))
    if [v.version for v in found] != list(range(1, len(found) + 1)):
        raise RuntimeError("schema_versions.txt must number its versions 1..n without gaps")
    return tuple(found)


def schema_version() -> SchemaVersion:
    """The schema this rota needs, and makes (`rota migrate`)."""
    return schema_versions()[-1]
