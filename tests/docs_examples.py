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

Blocks of other languages (text, sql, yaml, toml, ...) are text to read.
"""

from __future__ import annotations

import re
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
    mode: str  # "run", "background", "retry", "file", "skip" or "text"
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
            body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i].lstrip())
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
import ast, asyncio, json, sys, traceback
namespace = {"__name__": "__main__"}
for line in sys.stdin:
    code = json.loads(line)
    try:
        compiled = compile(code, "<docs>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(compiled, namespace)
        if asyncio.iscoroutine(result):
            asyncio.run(result)
        print(json.dumps({"ok": True}), flush=True)
    except BaseException:
        print(json.dumps({"ok": False, "error": traceback.format_exc()}), flush=True)
"""
