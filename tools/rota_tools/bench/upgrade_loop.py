"""`rota migrate` raced against live traffic, again and again: the previous
release's producer, loader and two workers run under load; this version's
`rota migrate` runs beside them (its time and exit code kept); then the
processes are replaced one by one (loader, a worker, the producer, the
other worker). Each run counts what was acknowledged, what ran, what ran
twice, and the error lines of every process's log (an old process must not
fail on the migrated schema).

    python -m rota_tools.bench.upgrade_loop 5cf3eb7 --runs 20 --out /tmp/loop

The old version runs from a throw-away worktree (rota_tools.bench.compare);
each run has its own PostgreSQL and Redis. Logs of a failed run are kept.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rota_tools.bench.compare import Side, checkout, repository_root
from rota_tools.bench.faults import (
    UpgradeFleet,
    left,
    nothing_left,
)
from rota_tools.bench.harness import wait_for
from rota_tools.devservers import local_postgres, local_redis

# A process's log line that reports a failure (rota logs "... failed: ..."
# and "could not ...", Python a traceback).
ERROR_LINE = re.compile(r"Traceback|\bERROR\b|Error:| failed\b|could not be stored|^rota: ")
PER_TASK = "0.02"


def error_lines(workdir: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for log in sorted(workdir.glob("*.log")):
        bad = [line[:300] for line in log.read_text(errors="replace").splitlines()]
        bad = [line for line in bad if ERROR_LINE.search(line)]
        if bad:
            found[log.name] = bad[:10]
    return found


def one_run(
    old: Side, revision: str, rate: float, seconds: float, keep: Path | None
) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(local_postgres())
        rd = stack.enter_context(local_redis())
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rota-loop-")))
        with UpgradeFleet(workdir, pg, rd, old) as fleet:
            report = _run(fleet, rate, seconds)
        report["errors"] = error_lines(workdir)
        report["ok"] = (
            report["migrate"]["exit"] == 0
            and report["lost"] == 0
            and report["duplicates"] == 0
            and report["drained"]
            and report["survived"]
            and not report["errors"]
        )
        if keep is not None and not report["ok"]:
            shutil.copytree(
                workdir, keep / f"failed-{revision}-{int(time.time())}", dirs_exist_ok=True
            )
        return report


def _run(fleet: UpgradeFleet, rate: float, seconds: float) -> dict[str, Any]:
    rolled = fleet.roll(rate, seconds)
    survived = rolled.survived_migration and all(fleet.alive().values())
    fleet.stop("producer")
    drained = wait_for(lambda: nothing_left(fleet.settings), 180, errors=(Exception,))
    acknowledged = set(fleet.acknowledged())
    runs = Counter(run.task for run in fleet.runs())
    migrated = rolled.new_migrate
    return {
        "migrate": {
            "exit": migrated.returncode,
            "seconds": round(rolled.migrate_seconds, 2),
            "stdout": migrated.stdout.strip()[-300:],
            "stderr": migrated.stderr.strip()[-2000:],
        },
        "survived": survived,
        "drained": drained,
        "left": left(fleet.settings),
        "acknowledged": len(acknowledged),
        "ran": len(acknowledged & set(runs)),
        "lost": len(acknowledged - set(runs)),
        "duplicates": sum(1 for n in runs.values() if n > 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revision", help="the previous release (a commit)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rate", type=float, default=250.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=None, help="the report, and failed runs' logs")
    args = parser.parse_args(argv)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    failures = 0
    with checkout(repository_root(), args.revision, "old") as old:
        for i in range(args.runs):
            report = one_run(old, args.revision, args.rate, args.seconds, args.out)
            failures += not report["ok"]
            line = json.dumps({"run": i + 1, "revision": args.revision, **report})
            print(line, flush=True)
            if args.out is not None:
                with (args.out / f"runs-{args.revision}.jsonl").open("a") as f:
                    f.write(line + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
