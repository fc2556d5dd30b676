"""Every code example of README.md and docs/ runs against real servers, as a
reader would run it, or says why it is not run (tests/docs_examples.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs_examples import ROOT, Session, blocks, pages


def test_every_example_runs_or_says_why_not() -> None:
    """No block is skipped without a reason, and each page's marks parse."""
    for page in pages():
        for block in blocks(page):
            if block.mode == "skip":
                assert len(block.reason) >= 10, f"{block.where}: give the reason it is not run"


def _runnable(page: Path) -> bool:
    return any(b.mode not in ("skip", "text") for b in blocks(page))


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
    running = Session(tmp_path, env, sys.executable)
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
