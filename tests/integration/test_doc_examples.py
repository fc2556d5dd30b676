"""Every code example of README.md and docs/ runs against real servers, as a
reader would run it, or says why it is not run (tests/docs_examples.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs_examples import DRIVER, ROOT, Block, blocks, pages

SHELL_TIMEOUT = 180.0
RETRY_SECONDS = 60.0


def test_every_example_runs_or_says_why_not() -> None:
    """No block is skipped without a reason, and each page's marks parse."""
    for page in pages():
        for block in blocks(page):
            if block.mode == "skip":
                assert len(block.reason) >= 10, f"{block.where}: give the reason it is not run"


def _runnable(page: Path) -> bool:
    return any(b.mode not in ("skip", "text") for b in blocks(page))


class Session:
    """One page's run: a scratch directory, a Python interpreter for its
    ```python blocks, and the background processes its blocks started."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.directory = directory
        self.env = env
        self.python: subprocess.Popen[str] | None = None
        self.background: list[subprocess.Popen[bytes]] = []

    def run(self, block: Block) -> None:
        if block.mode == "file":
            path = self.directory / block.reason
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code)
        elif block.mode == "retry":
            deadline = time.monotonic() + RETRY_SECONDS
            while True:
                try:
                    self._shell(block)
                    return
                except AssertionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        elif block.language == "python":
            self._python(block)
        elif block.mode == "background":
            self.background.append(
                subprocess.Popen(
                    ["bash", "-c", block.code],
                    cwd=self.directory,
                    env=self.env,
                    stdout=subprocess.DEVNULL,
                    stderr=open(self.directory / f"background-{block.line}.log", "wb"),  # noqa: SIM115
                    start_new_session=True,
                )
            )
        else:
            self._shell(block)

    def _shell(self, block: Block) -> None:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.code],
            cwd=self.directory,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=SHELL_TIMEOUT,
        )
        assert done.returncode == 0, (
            f"{block.where} failed:\n{block.code}\n{done.stdout}\n{done.stderr}"
        )

    def _python(self, block: Block) -> None:
        if self.python is None:
            self.python = subprocess.Popen(
                [sys.executable, "-c", DRIVER],
                cwd=self.directory,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        assert self.python.stdin is not None and self.python.stdout is not None
        self.python.stdin.write(json.dumps(block.code) + "\n")
        self.python.stdin.flush()
        reply = json.loads(self.python.stdout.readline() or '{"ok": false, "error": "exited"}')
        assert reply["ok"], f"{block.where} failed:\n{block.code}\n{reply.get('error')}"

    def close(self) -> None:
        if self.python is not None:
            self.python.kill()
            self.python.wait()
        for process in self.background:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture
def session(tmp_path: Path, database_url: str, redis_url: str) -> Iterator[Session]:
    env = {
        **os.environ,
        "ROTA_DATABASE_URL": database_url,
        "ROTA_REDIS_URL": redis_url,
        "PYTHONPATH": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "ROTA_CHECKOUT": str(ROOT),
    }
    running = Session(tmp_path, env)
    try:
        yield running
    finally:
        running.close()


@pytest.mark.parametrize(
    "page",
    [p for p in pages() if _runnable(p)],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_a_pages_examples_run_in_order(page: Path, session: Session) -> None:
    for block in blocks(page):
        if block.mode not in ("skip", "text"):
            session.run(block)
