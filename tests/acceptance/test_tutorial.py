"""The tutorial as a new user follows it: a fresh virtual environment, rota
installed from the checkout with pip (not the test suite's environment), and
the tutorial page's commands and code run in order against real servers,
down to the worker having run the task."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs_examples import ROOT, Session, blocks

TUTORIAL = ROOT / "docs" / "tutorial" / "index.md"


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with rota pip-installed from the checkout."""
    venv = tmp_path_factory.mktemp("newcomer") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # A copy of the checkout's sources, so the build writes nothing into it.
    done = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return venv


@pytest.fixture
def newcomer(
    tmp_path: Path, fresh_venv: Path, database_url: str, redis_url: str
) -> Iterator[Session]:
    bin_dir = fresh_venv / "bin"
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "VIRTUAL_ENV": str(fresh_venv),
        "ROTA_DATABASE_URL": database_url,
        "ROTA_REDIS_URL": redis_url,
        "LANG": "C.UTF-8",
    }
    session = Session(tmp_path, env, str(bin_dir / "python"))
    try:
        yield session
    finally:
        session.close()


def test_the_tutorial_runs_in_a_fresh_environment(newcomer: Session) -> None:
    steps = [b for b in blocks(TUTORIAL) if b.mode not in ("skip", "text")]
    assert any(b.mode == "background" for b in steps) and any(b.mode == "retry" for b in steps)
    for block in steps:
        newcomer.run(block)
    assert "welcome, Ada!" in (newcomer.directory / "outbox.txt").read_text()
