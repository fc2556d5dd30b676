"""A rolling upgrade under load: the producer, loader and workers of an
earlier version run while `rota migrate` of this one is applied, then are
replaced one by one by this version's; the chaos suite's history check
follows (every acknowledged task ran, none twice at once, the limits held).

The earlier version is, by default, the one just before the newest
migration (`version_before_newest_migration`): each migration to come is
run by it against the processes of the version it upgrades.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

from rota_tools.bench.compare import checkout, git, repository_root
from rota_tools.bench.faults import UpgradeFleet, history_report
from rota_tools.devservers import local_postgres, local_redis


def version_before_newest_migration(repo: Path) -> str:
    """The parent of the commit that added the newest migration."""
    return (
        git(repo, "log", "-1", "--diff-filter=A", "--format=%H", "--", "rota/sql/migrations") + "^"
    )


def run_rolling_upgrade(
    *, old_revision: str | None = None, rate: float = 80.0, seconds: float = 4.0
) -> dict[str, Any]:
    repo = repository_root()
    revision = old_revision or version_before_newest_migration(repo)
    with contextlib.ExitStack() as stack:
        old = stack.enter_context(checkout(repo, revision, "old"))
        pg = stack.enter_context(local_postgres())
        rd = stack.enter_context(local_redis())
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rota-upgrade-")))
        with UpgradeFleet(workdir, pg, rd, old) as fleet:
            return _run(fleet, revision, rate, seconds)


def _run(fleet: UpgradeFleet, revision: str, rate: float, seconds: float) -> dict[str, Any]:
    rolled = fleet.roll(rate, seconds)
    rolled.new_migrate.check_returncode()
    report = history_report(fleet, time.time(), 0, all(fleet.alive().values()), rate)
    runs = fleet.runs()
    report.update(
        {
            "old_revision": revision,
            "old_migrate": rolled.old_migrate,
            "new_migrate": rolled.new_migrate.stdout.strip(),
            "old_processes_survived_the_migration": rolled.survived_migration,
            "replaced": rolled.replaced,
            "runs_by_version": {
                version: sum(1 for run in runs if fleet.pid_version.get(run.pid) == version)
                for version in ("old", "new")
            },
        }
    )
    return report
