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
