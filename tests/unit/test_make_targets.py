"""What the Makefile's targets run (`make -n`, which runs nothing): the
demo needs only the virtual environment (no server package: it runs on the
embedded servers), `make install` installs the test servers' packages,
`make dist` builds both distributions, and the venv has the embedded extra."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "infra" / "install-servers.sh"


def _planned(target: str) -> list[str]:
    # VENV points at a directory that is never made: every step is planned.
    done = subprocess.run(
        ["make", "-n", "-C", str(ROOT), target, "VENV=/nonexistent/venv"],
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in done.stdout.splitlines() if not line.startswith("make")]


def test_the_demo_needs_no_server_package() -> None:
    steps = _planned("demo")
    assert not any("install-servers" in step for step in steps), steps
    assert any("'.[" in step and "embedded" in step for step in steps), steps
    assert steps[-1].endswith("-m rota demo")


def test_install_installs_the_test_servers_packages() -> None:
    assert any(step == "bash infra/install-servers.sh" for step in _planned("install"))
    script = SCRIPT.read_text()
    for package in ("postgresql", "redis-server", "pgbouncer", "chromium", "default-jre-headless"):
        assert f"missing+=({package}" in script, package


def test_dist_builds_both_distributions_into_dist() -> None:
    steps = _planned("dist")
    assert "-m build --outdir dist ." in " | ".join(steps)
    assert "-m build --outdir dist tools" in " | ".join(steps)
