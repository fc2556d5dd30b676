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
    total is known."""

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
                MofNCompleteColumn,
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
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(what, total=total, rate="")

    def advance(self, count: int, stage: str | None = None) -> None:
        self.done += count
        seconds = max(self._clock() - self.started, 1e-9)
        rate = self.done / seconds
        if self._bar is not None:
            label = f"{self.what} ({stage})" if stage else self.what
            self._bar.update(
                self._task, completed=self.done, description=label, rate=f"{rate:,.0f}/s"
            )
        elif self.as_json:
            line: dict[str, Any] = {
                "progress": self.what,
                "done": self.done,
                "per_second": round(rate, 1),
                "seconds": round(seconds, 3),
            }
            if stage:
                line["stage"] = stage
            if self.total is not None:
                line["total"] = self.total
                if rate > 0:
                    line["seconds_left"] = round(max(0, self.total - self.done) / rate, 1)
            typer.echo(json.dumps(line), err=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
