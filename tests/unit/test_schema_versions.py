"""The ledger of schema versions (rota/sql/schema_versions.txt) names the SQL
this rota ships: a change to it without a new line would let processes run
on a schema they were not made for (rota.core.versions)."""

from __future__ import annotations

import itertools

from rota.core import versions
from rota.sql import schema_version, schema_versions, sql_checksum


def test_the_newest_version_is_the_sql_as_it_is() -> None:
    newest = schema_version()
    checksum = sql_checksum()
    assert newest.checksum == checksum, (
        "bump the schema version: the SQL under rota/sql changed (schema.sql, migrations/, "
        "functions/ or roles.sql); add to rota/sql/schema_versions.txt the line "
        f"`{newest.version + 1} {newest.supports_from} {checksum}` (raise the second "
        "number when compatibility forms go: docs/howto/upgrade.md)"
    )


def test_versions_only_grow_and_support_what_came_before() -> None:
    lines = schema_versions()
    assert [v.version for v in lines] == list(range(1, len(lines) + 1))
    for before, after in itertools.pairwise(lines):
        assert before.supports_from <= after.supports_from < after.version
    assert len({v.checksum for v in lines}) == len(lines)


def test_a_process_runs_on_its_version_and_on_newer_ones_that_support_it() -> None:
    needs = schema_version().version
    assert versions.problem(versions.At(needs, 0)) is None
    assert versions.problem(versions.At(needs + 1, needs)) is None
    assert versions.problem(versions.At(needs - 1, 0)) == (
        f"the database is at schema {needs - 1}, this rota needs {needs}: run rota migrate"
    )
    too_new = versions.problem(versions.At(needs + 2, needs + 1))
    assert too_new is not None and too_new.endswith("upgrade rota")
