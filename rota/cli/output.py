"""How the operators' commands print: text for people, `--json` for scripts."""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Annotated, Any

import typer

from rota.model.jsondata import plain
from rota.runtime.redact import printable

AsJson = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]
Actor = Annotated[
    str | None, typer.Option(help="who to record in the audit log (default: user@host)")
]


def actor_or_default(actor: str | None) -> str:
    if actor:
        return actor
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


def emit(data: Any, as_json: bool, text: Callable[[], str]) -> None:
    """JSON (escaped by its encoder), or text with no terminal control in it:
    errors and dead letters are anybody's text."""
    if as_json:
        typer.echo(json.dumps(plain(data), indent=2))
    else:
        typer.echo(printable(text()))


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}".rstrip("0").rstrip(".") if value % 1 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Rows as aligned columns under their headers."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines) if rows else lines[0] + "\n(none)"


class Progress:
    """Progress of a long command, on stderr (stdout keeps its result): a
    rich bar on a terminal, a JSON line per step with `--json`, and nothing
    otherwise. Shows what is done, the rate, and the time left when the
    total (or the fraction done) is known."""

    def __init__(self, what: str, as_json: bool, total: int | None = None) -> None:
        import sys
        import time

        self.what = what
        self.as_json = as_json
        self.total = total
        self.done = 0
        self.started = time.monotonic()
        self._clock = time.monotonic
        self._bar: Any = None
        self._task: Any = None
        if not as_json and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import (
                Progress as Bar,
            )

            self._bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[counts]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(what, total=total, counts="")

    def advance(self, count: int, stage: str | None = None, **figures: int) -> None:
        """`count` more done."""
        self.show(self.done + count, stage, **figures)

    def show(
        self,
        done: int,
        stage: str | None = None,
        *,
        fraction: float | None = None,
        **figures: int,
    ) -> None:
        """`done` in all; `fraction` of the whole work done, where the total
        is not counted in the same units (time left follows from it);
        `figures` are other counts shown beside it."""
        self.done = done
        seconds = max(self._clock() - self.started, 1e-9)
        rate = done / seconds
        if fraction is None and self.total:
            fraction = min(1.0, done / self.total)
        left = None
        if fraction is not None and fraction > 0:
            left = seconds * max(0.0, 1 - fraction) / fraction
        if self._bar is not None:
            label = f"{self.what} ({stage})" if stage else self.what
            counts = f"{done:,}" + (f" of {self.total:,}" if self.total is not None else "")
            counts += f"  {rate:,.0f}/s"
            counts += "".join(f"  {name} {value:,}" for name, value in figures.items())
            # The bar runs over thousandths of the work when only a fraction is known.
            whole = None if fraction is None else 1000
            part = None if fraction is None else round(fraction * 1000)
            self._bar.update(
                self._task, total=whole, completed=part or 0, description=label, counts=counts
            )
        elif self.as_json:
            line: dict[str, Any] = {
                "progress": self.what,
                "done": done,
                "per_second": round(rate, 1),
                "seconds": round(seconds, 3),
            }
            if stage:
                line["stage"] = stage
            if self.total is not None:
                line["total"] = self.total
            if fraction is not None:
                line["fraction"] = round(fraction, 4)
            if left is not None:
                line["seconds_left"] = round(left, 1)
            line.update(figures)
            typer.echo(json.dumps(line), err=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
