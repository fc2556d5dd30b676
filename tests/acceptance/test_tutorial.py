"""The tutorial as a new user follows it: rota's wheel built from the
checkout (as `make dist` builds it), and in a fresh directory outside the
checkout, with nothing but Python, the tutorial page's commands and code run
in order: the install into a new virtual environment, `rota dev`'s embedded
servers, down to the worker having run the task. Nothing of the suite's
environment or servers is used."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.docs_examples import ROOT, Session, blocks

TUTORIAL = ROOT / "docs" / "tutorial" / "index.md"
WHEEL_DIR = "path/to/rota/dist/"  # the tutorial's stand-in for the reader's checkout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """rota's wheel and sdist, built as `make dist` builds them."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.mark.slow(reason="builds rota's wheel and pip-installs it with its dependencies")
def test_the_tutorial_runs_from_an_empty_directory_on_the_wheel(tmp_path: Path, dist: Path) -> None:
    project = tmp_path / "hello-rota"
    project.mkdir()
    assert not project.is_relative_to(ROOT)
    venv = project / ".venv"
    # The reader's shell in each terminal: the directory, the environment
    # active (tutorial, step 2), a Python 3.11 on PATH; no ROTA_* anywhere.
    env = {
        "HOME": str(tmp_path),
        "PATH": os.pathsep.join(
            [str(venv / "bin"), str(Path(sys._base_executable).parent), "/usr/bin", "/bin"]
        ),
        "VIRTUAL_ENV": str(venv),
        "LANG": "C.UTF-8",
    }
    steps = [b for b in blocks(TUTORIAL) if b.mode not in ("skip", "text")]
    modes = {b.mode for b in steps}
    assert {"install", "servers", "background", "retry", "file"} <= modes
    session = Session(project, env, str(venv / "bin" / "python"), newcomer={WHEEL_DIR: f"{dist}/"})
    timings = []
    try:
        for block in steps:
            started = time.monotonic()
            session.run(block)
            timings.append(f"{block.where} {block.mode}: {time.monotonic() - started:.1f} s")
        outbox = (project / "outbox.txt").read_text()
        assert "to ada@example.com: welcome, Ada! (tenant acme)" in outbox
    finally:
        session.close()
        print("\n".join(timings))
    # rota dev wrote the URLs where rota reads them, and stopped its servers.
    written = (project / ".env").read_text()
    assert "ROTA_DATABASE_URL=postgresql://" in written and "ROTA_REDIS_URL=redis://" in written
    assert (project / ".rota" / "postgres" / "PG_VERSION").exists()
    assert not (project / ".rota" / "postgres" / "postmaster.pid").exists()
