"""Databases made by an earlier rota, for tests/integration/test_migrations.py.

`python -m rota_tools.migration_fixtures [COMMIT]` checks COMMIT out in a
temporary git worktree, migrates a throwaway database with that commit's own
code to each version of VERSIONS, fills it with rows through that version's
functions (rota_tools/sql/fixtures.sql), and writes its schema rota, rows
included, as plain SQL to tests/fixtures/migrations/NNNN.sql.gz. The default
commit is the last whose migrations made functions.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg

from rota_tools.devservers import local_postgres, postgres_bindir
from rota_tools.sql import query

DEFAULT_COMMIT = "f4fb12d"
FIXTURES = Path("tests/fixtures/migrations")
VERSIONS = (30, 47)
# From this version on (rota.joins, 0039; rota.results, 0037), a fixture also
# holds a kept result and a waiting join.
WORKFLOWS = 39

# Run in the earlier commit's tree, with only that tree on the path.
_MIGRATE = (
    "import sys, psycopg\n"
    "from rota.core.migrate import migrate\n"
    "with psycopg.connect(sys.argv[1], autocommit=True) as conn:\n"
    "    migrate(conn, target=int(sys.argv[2]))\n"
)
# Lines that differ between two dumps of one database: version banners and
# the per-dump random key of \restrict.
_UNSTABLE = ("-- Dumped", "\\restrict", "\\unrestrict")


def dump(url: str, *, schema_only: bool = False) -> str:
    """pg_dump of the schema rota (and its rows, unless `schema_only`), plain
    SQL, without owners or the lines that differ between dumps."""
    command = [str(postgres_bindir() / "pg_dump"), "--schema=rota", "--no-owner"]
    command += ["--schema-only"] if schema_only else []
    done = subprocess.run([*command, url], check=True, capture_output=True, text=True)
    return "".join(
        line for line in done.stdout.splitlines(keepends=True) if not line.startswith(_UNSTABLE)
    )


def restore(url: str, fixture: Path) -> None:
    """Loads a fixture into the (empty) database at `url`."""
    subprocess.run(
        [str(postgres_bindir() / "psql"), "-q", "-X", "-v", "ON_ERROR_STOP=1", "-d", url],
        input=gzip.decompress(fixture.read_bytes()),
        check=True,
        capture_output=True,
    )


@contextlib.contextmanager
def _worktree(commit: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="rota-fixtures-") as place:
        tree = Path(place) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], check=True)


def make(commit: str, out: Path) -> list[Path]:
    written = []
    with _worktree(commit) as tree, local_postgres() as server:
        for version in VERSIONS:
            name = f"rota_at_{version}"
            with psycopg.connect(server.url, autocommit=True) as conn:
                conn.execute(
                    psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name))
                )
            url = server.url.rsplit("/", 1)[0] + "/" + name
            subprocess.run(
                [sys.executable, "-c", _MIGRATE, url, str(version)],
                cwd=tree,
                env={**os.environ, "PYTHONPATH": str(tree)},
                check=True,
            )
            with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
                conn.execute(query("fixture_rows").encode())
                if version >= WORKFLOWS:
                    conn.execute(query("fixture_result_and_join").encode())
            path = out / f"{version:04d}.sql.gz"
            path.write_bytes(gzip.compress(dump(url).encode(), mtime=0))
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit", nargs="?", default=DEFAULT_COMMIT)
    parser.add_argument("--out", type=Path, default=FIXTURES)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in make(args.commit, args.out):
        print(path)


if __name__ == "__main__":
    main()
