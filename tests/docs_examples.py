"""The code blocks of README.md and docs/: found, and run as a reader would.

A page's blocks run in order, in one scratch directory, with ROTA_* pointing
at the test's servers: ```python blocks in one interpreter (a page is one
session, as a reader pastes its blocks into one), ```sh / ```bash / ```shell
blocks in bash. A ```python block whose first line names a file
(`# tasks.py`) is that file: written to the directory, not run. A comment
line right above a block changes how it runs:

    <!-- not run: REASON -->   shown, never run (the reason is required)
    <!-- run: background -->  started in the background (a worker, a
                               loader), stopped when the page ends
    <!-- run: until it passes --> run again until it succeeds, for up to a
                               minute (it waits on a background process)
    <!-- run: install -->     the reader's installation (a virtual
                               environment, pip install): run only by a
                               newcomer's session, which installs the wheel
                               built from the checkout in a fresh directory
    <!-- run: servers -->     the reader's servers (`rota dev`), in the
                               background: run only by a newcomer's session;
                               others have the test's servers in ROTA_*

Blocks of other languages (text, sql, yaml, toml, ...) are text to read.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_LANGUAGES = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
_FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")
_FILE = re.compile(r"^# (?:file: )?(?P<path>[\w./-]+\.py)$")
_MARK = re.compile(r"^<!--\s*(?P<kind>not run|run):\s*(?P<value>.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, from 1
    language: str  # "python" or "sh", or the fence's own word for text
    code: str
    mode: str  # "run", "background", "retry", "install", "servers", "file", "skip" or "text"
    reason: str = ""  # why it is skipped; for "file", the file's name

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """README.md and every page of the site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """The page's fenced code blocks, with how each runs."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    mark: tuple[str, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        matched = _FENCE.match(line)
        if matched is None:
            stripped = line.strip()
            marked = _MARK.match(stripped)
            if marked is not None:
                mark = (marked["kind"], marked["value"])
            elif stripped:
                mark = None
            i += 1
            continue
        fence, indent = matched["fence"], len(matched["indent"])
        word = (matched["info"].strip().split() or [""])[0].strip("{}.").lower()
        body: list[str] = []
        start = i + 1
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            text = lines[i]
            body.append(text[indent:] if text[:indent].strip() == "" else text.lstrip())
            i += 1
        i += 1  # the closing fence
        language = RUN_LANGUAGES.get(word, word or "text")
        mode, reason = "run", ""
        if mark is not None:
            kind, value = mark
            if kind == "not run":
                mode, reason = "skip", value
            elif value == "background":
                mode = "background"
            elif value == "until it passes":
                mode = "retry"
            elif value in ("install", "servers"):
                mode = value
            else:
                raise ValueError(f"{page}:{start}: unknown mark 'run: {value}'")
        if language not in ("python", "sh"):
            mode = "text"
        named = _FILE.match(body[0]) if language == "python" and body else None
        if named is not None and mode == "run":
            mode, reason = "file", named["path"]
        found.append(Block(page, start, language, "\n".join(body) + "\n", mode, reason))
        mark = None
    return found


# Runs ```python blocks in one namespace: a block per line of JSON on stdin,
# a line of JSON back (ok, or the error). Top-level `await` works, as in
# `python -m asyncio`.
DRIVER = r"""
import ast, asyncio, json, os, sys, traceback
# What a block prints (its subprocesses too) goes to stderr: the replies
# have the original stdout to themselves.
replies = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
namespace = {"__name__": "__main__"}
for line in sys.stdin:
    code = json.loads(line)
    try:
        compiled = compile(code, "<docs>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(compiled, namespace)
        if asyncio.iscoroutine(result):
            asyncio.run(result)
        sys.stdout.flush()
        reply = {"ok": True}
    except BaseException:
        reply = {"ok": False, "error": traceback.format_exc()}
    replies.write(json.dumps(reply) + "\n")
    replies.flush()
"""


SHELL_TIMEOUT = 180.0
RETRY_SECONDS = 60.0


class Session:
    """One page's run: a scratch directory, a Python interpreter for its
    ```python blocks, and the background processes its blocks started.

    A newcomer's session (`newcomer`: what to put in place of the text of
    the page's install blocks, such as the wheel's path) runs the install and
    servers blocks too; any other skips them, its environment and servers
    standing in."""

    def __init__(
        self,
        directory: Path,
        env: dict[str, str],
        python: str,
        newcomer: dict[str, str] | None = None,
    ) -> None:
        self.directory = directory
        self.env = env
        self.executable = python
        self.newcomer = newcomer
        self.python: subprocess.Popen[str] | None = None
        self.background: list[subprocess.Popen[bytes]] = []

    def run(self, block: Block) -> None:
        if block.mode in ("install", "servers") and self.newcomer is None:
            return
        if block.mode == "install":
            assert self.newcomer is not None
            code = block.code
            for text, replacement in self.newcomer.items():
                assert text in code, f"{block.where}: no {text!r} to replace"
                code = code.replace(text, replacement)
            self._shell(Block(block.page, block.line, block.language, code, "run"))
        elif block.mode == "file":
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
        elif block.mode in ("background", "servers"):
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
                [self.executable, "-c", DRIVER],
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
        # The last started first: the worker before the servers it uses.
        for process in reversed(self.background):
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signal.SIGKILL)
