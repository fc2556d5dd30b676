"""After `rota migrate`, every function of the previous releases' databases
can still be called as they call it: same name, their arguments (further
ones only with defaults), same result. Their processes run on until they
are replaced (docs/howto/upgrade.md: a signature that changes keeps its old
form for a release). The releases: the database of the 0047 fixture (commit
f4fb12d's code) and one made by commit 5cf3eb7 (from git history)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
import pytest

from rota.core.migrate import migrate
from rota_tools.bench.compare import checkout, repository_root
from rota_tools.migration_fixtures import restore
from tests.helpers import shallow_clone

FIXTURES = Path(__file__).parents[1] / "fixtures" / "migrations"

# Functions of earlier releases that are gone, and why no process of theirs
# calls them: each entry is checked to be gone (and to be needed: there in
# the releases that list it).
REMOVED = {
    "rota.lock_queues(integer[])": (
        "only the old rota.fair_starts called it, replaced in the same transaction",
        {"5cf3eb7"},
    ),
    "rota.fair_starts(integer[], integer[])": (
        "only rota's placement called it, replaced in the same transaction",
        {"5cf3eb7", "0047"},
    ),
    "rota.lock_tags(integer[], integer[])": (
        "only rota's placement called it, replaced in the same transaction",
        {"0047"},
    ),
}


def removed_from(release: str) -> set[str]:
    return {name for name, (_, releases) in REMOVED.items() if release in releases}


class Function(NamedTuple):
    name: str  # schema-qualified
    arguments: tuple[str, ...]  # input argument types
    defaults: int  # how many of the last arguments have defaults
    result: str

    @property
    def signature(self) -> str:
        return f"{self.name}({', '.join(self.arguments)})"

    def accepts(self, old: Function) -> bool:
        """Whether a call made to `old` reaches this function alike."""
        given = len(old.arguments)
        return (
            self.name == old.name
            and self.arguments[:given] == old.arguments
            and len(self.arguments) - self.defaults <= given
            and self.result == old.result
        )


def functions(url: str) -> list[Function]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT 'rota.' || p.proname,"
            " array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes::oid[]) t),"
            " p.pronargdefaults, pg_get_function_result(p.oid)"
            " FROM pg_proc p WHERE p.pronamespace = 'rota'::regnamespace"
        ).fetchall()
    return [Function(name, tuple(args), defaults, result) for name, args, defaults, result in rows]


def missing_after_migrate(url: str) -> list[str]:
    before = functions(url)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
    after = functions(url)
    return sorted(
        old.signature
        for old in before
        if not any(new.accepts(old) for new in after) and old.signature not in REMOVED
    )


def test_the_0047_fixtures_functions_are_kept(empty_database_url: str) -> None:
    restore(empty_database_url, FIXTURES / "0047.sql.gz")
    before = {f.signature for f in functions(empty_database_url)}
    assert removed_from("0047") <= before  # each removal is of a function that was there
    assert missing_after_migrate(empty_database_url) == []
    after = {f.signature for f in functions(empty_database_url)}
    assert not set(REMOVED) & after


@pytest.mark.skipif(shallow_clone(), reason="the earlier version comes from git history")
def test_5cf3eb7s_functions_are_kept_but_for_the_removals_due(empty_database_url: str) -> None:
    with checkout(repository_root(), "5cf3eb7", "old") as old:
        env: dict[str, Any] = {**old.env(), "ROTA_DATABASE_URL": empty_database_url}
        env.pop("ROTA_DIRECT_DATABASE_URL", None)
        subprocess.run(
            [sys.executable, "-m", "rota", "migrate"],
            env=env,
            cwd=old.tree,
            check=True,
            capture_output=True,
        )
    before = {f.signature for f in functions(empty_database_url)}
    assert removed_from("5cf3eb7") <= before  # each removal is of a function that was there
    assert missing_after_migrate(empty_database_url) == []
    after = {f.signature for f in functions(empty_database_url)}
    assert not set(REMOVED) & after
