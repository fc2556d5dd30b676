"""The enqueue API is checked by mypy against the task function's signature:
a wrong argument is a type error, a right one is not, and the public enqueue
signatures hold no `Any`."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

from mypy import api

import rota
from rota.contrib import sqlalchemy as contrib_sqlalchemy
from rota.task import Enqueue, Task

HEADER = """
import rota

app = rota.App()

@app.task(queue="pdfs")
def parse_pdf(path: str, pages: int = 0, *, tenant: str = "") -> int:
    return pages

@app.task
async def notify(user_id: int) -> None:
    return None
"""

RIGHT = """
async def main() -> None:
    parse_pdf.using(tenant="alice", priority=5).enqueue("a.pdf", pages=3)
    parse_pdf.using(tenant="alice").enqueue("a.pdf", 3, tenant="the task's own")
    await notify.using(tenant="alice", countdown=60).aenqueue(7)
    app.enqueue_many([parse_pdf.using(tenant="alice").prepare(p) for p in ["a", "b"]])
    pages: int = parse_pdf("a.pdf")
    name: str = parse_pdf.__name__
    reveal_type(parse_pdf.using(tenant="a").enqueue("a.pdf"))
"""

WRONG = {
    "a wrong type": 'parse_pdf.using(tenant="alice").enqueue(42)',
    "an unknown keyword": 'parse_pdf.using(tenant="alice").enqueue("a.pdf", colour="red")',
    "a missing argument": 'parse_pdf.using(tenant="alice").enqueue()',
    "too many arguments": 'notify.using(tenant="alice").prepare(1, 2)',
    "no tenant": 'parse_pdf.using().enqueue("a.pdf")',
    "an option among the arguments": 'parse_pdf.using(tenant="a").enqueue("a.pdf", eta=None)',
    "a wrong option type": 'parse_pdf.using(tenant="a", priority="high").enqueue("a.pdf")',
}


def test_right_arguments_type_check_and_wrong_ones_are_errors(tmp_path: Path) -> None:
    """One mypy run: the right calls raise nothing; each wrong call, on its
    own line, raises an error there."""
    source = tmp_path / "example.py"
    body = HEADER + textwrap.dedent(RIGHT) + "\n\ndef wrong() -> None:\n"
    lines = {}
    for name in sorted(WRONG):
        lines[body.count("\n") + 1] = name
        body += f"    {WRONG[name]}\n"
    source.write_text(body)
    out, err, _ = api.run(
        [
            "--strict",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--follow-imports",
            "silent",
            str(source),
        ]
    )
    errors = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    assert errors == set(lines), (out + err, lines)
    assert 'Revealed type is "uuid.UUID"' in out


def _annotations(fn: object) -> list[str]:
    signature = inspect.signature(fn)  # type: ignore[arg-type]
    texts = [str(p.annotation) for p in signature.parameters.values()]
    return [*texts, str(signature.return_annotation)]


def test_the_public_enqueue_signatures_hold_no_any() -> None:
    public = [
        Task.using,
        Enqueue.enqueue,
        Enqueue.aenqueue,
        Enqueue.prepare,
        rota.App.enqueue,
        rota.App.aenqueue,
        rota.App.prepare,
        rota.App.enqueue_many,
        rota.App.aenqueue_many,
        contrib_sqlalchemy.enqueue,
        contrib_sqlalchemy.enqueue_after_commit,
    ]
    for fn in public:
        assert not any("Any" in text for text in _annotations(fn)), (fn, _annotations(fn))
