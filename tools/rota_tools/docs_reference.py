"""Reference pages generated from the code, so that they cannot drift from it:
the settings (rota.settings.Settings), the `rota` command tree, the metrics
(rota.readmodel.metrics) and the console's HTTP routes.

It is also the documentation site's MkDocs hook (mkdocs.yml `hooks:`): a page
holding a marker such as `<!-- generated: settings -->` gets the generated
Markdown in its place at build time. Nothing here opens a connection.
"""

from __future__ import annotations

import ast
import html
import inspect
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import AliasChoices
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


def markdown_text(text: str) -> str:
    """`text` made safe for Markdown (and a table cell), code spans kept as
    they are: help texts hold `<PATH>`, `local[*]` and the like."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        escaped = html.escape(parts[i], quote=False)
        for char in "\\*_|":
            escaped = escaped.replace(char, "\\" + char)
        parts[i] = escaped
    return "`".join(parts)


def paragraphs(text: str) -> list[str]:
    """Help text as paragraphs, hard line wraps joined (click's `\\b` dropped)."""
    blocks = [block.splitlines() for block in inspect.cleandoc(text).split("\n\n")]
    joined = (" ".join(line.strip() for line in block if line.strip() != "\b") for block in blocks)
    return [block for block in joined if block]


# Settings


def env_names(name: str, field: FieldInfo, prefix: str) -> list[str]:
    """The environment variables a field is read from, the first the main one."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [choice for choice in alias.choices if isinstance(choice, str)]
    if isinstance(alias, str):
        return [alias]
    return [f"{prefix}{name}".upper()]


def type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "unset"
    if typing.get_origin(annotation) is typing.Literal:
        return " or ".join(f"`{value}`" for value in typing.get_args(annotation))
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return " or ".join(type_name(arg) for arg in typing.get_args(annotation))
    name = getattr(annotation, "__name__", str(annotation))
    return {"SecretStr": "secret", "Path": "path"}.get(name, name)


def field_type(field: FieldInfo) -> str:
    from rota.model.rules import parse_duration

    # Duration: a float after a validator that also takes "30m", "12h", "7d".
    if any(getattr(meta, "func", None) is parse_duration for meta in field.metadata):
        return "duration (seconds, or `30m`, `12h`, `7d`)"
    return type_name(field.annotation)


def default_text(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None or value is PydanticUndefined:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def settings_reference() -> str:
    """A table of every setting: its variable, type, default and description."""
    from rota.settings import Settings

    prefix = str(Settings.model_config.get("env_prefix", ""))
    lines = ["| Variable | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        main, *others = env_names(name, field, prefix)
        description = markdown_text(field.description or "")
        if others:
            description += " Also read from " + ", ".join(f"`{o}`" for o in others) + "."
        row = [f"`{main}`", field_type(field), default_text(field), description]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


# The command line


def walk_commands(command: Any, name: str, parent: Any = None) -> Iterator[tuple[Any, Any]]:
    """Each command of the tree under `command` with its context, depth first
    by name. Typed loosely: Typer may run on click or on its own copy of it."""
    context = command.context_class(command, info_name=name, parent=parent)
    yield command, context
    children: dict[str, Any] = getattr(command, "commands", {})
    for child in sorted(children):
        yield from walk_commands(children[child], child, context)


def root_command() -> Any:
    import typer.main

    from rota.cli import app

    return typer.main.get_command(app)


def command_paths() -> list[str]:
    """Every command of the CLI tree, as typed: `rota queue list`."""
    return [context.command_path for _, context in walk_commands(root_command(), "rota")]


def cli_reference() -> str:
    """Each command: its usage, help and options."""
    out: list[str] = []
    for command, context in walk_commands(root_command(), "rota"):
        level = "#" * min(2 + context.command_path.count(" "), 4)
        usage = command.get_usage(context).removeprefix("Usage:").strip()
        out += [f"{level} `{context.command_path}`", "", "```text", usage, "```", ""]
        out += [f"{markdown_text(p)}\n" for p in paragraphs(command.help or "")]
        rows = []
        for param in command.get_params(context):
            record = param.get_help_record(context)
            if record is None or param.name == "help":  # --help: on every command
                continue
            rows.append(f"| `{record[0]}` | {markdown_text(record[1])} |")
        if rows:
            out += ["| Option or argument | Description |", "| --- | --- |", *rows, ""]
    return "\n".join(out)


# Metrics

# Each class of rota.readmodel.metrics whose series it declares, and who serves them.
METRIC_SOURCES = {
    "WorkerMetrics": "Workers (`rota worker --metrics-port`)",
    "LoaderMetrics": "Loaders (`rota loader run --metrics-port`)",
    "OutageCollector": "Every process that serves `/metrics` (workers, loaders, the console)",
    "FiguresCollector": (
        "The overview (the console's `/metrics`, `rota dashboard --metrics-port`,"
        " `rota stats --format prometheus`)"
    ),
}
METRIC_KINDS = {
    "Counter": "counter",
    "CounterMetricFamily": "counter",
    "Gauge": "gauge",
    "GaugeMetricFamily": "gauge",
    "HistogramMetricFamily": "histogram",
    "LoopHistogram": "histogram",
}
# What the exposition format appends to a series' declared name.
EXPOSED_SUFFIX = {"counter": "_total", "gauge": "", "histogram": "_bucket, _sum, _count"}


def declared_metrics() -> dict[str, list[tuple[str, str, list[str], str]]]:
    """The series each class of rota.readmodel.metrics declares, read from its
    source (their values need servers): {class: [(name, kind, labels, help)]}."""
    from rota.readmodel import metrics

    found: dict[str, list[tuple[str, str, list[str], str]]] = {}
    for node in ast.parse(inspect.getsource(metrics)).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for call in ast.walk(node):
            if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
                continue
            kind = METRIC_KINDS.get(call.func.id)
            literal = [a.value for a in call.args[:2] if isinstance(a, ast.Constant)]
            if kind is None or len(literal) < 2:  # e.g. LoopHistogram's own, of any name
                continue
            name, documentation = str(literal[0]), str(literal[1])
            labels = next((k.value for k in call.keywords if k.arg == "labels"), None)
            if labels is None and len(call.args) > 2:
                labels = call.args[2]
            label_value = ast.literal_eval(labels) if labels is not None else []
            names = [label_value] if isinstance(label_value, str) else list(label_value)
            found.setdefault(node.name, []).append((name, kind, names, documentation))
    return found


def metrics_reference() -> str:
    out: list[str] = []
    for cls, series in declared_metrics().items():
        out += [f"## {METRIC_SOURCES.get(cls, cls)}", ""]
        out += ["| Series | Type | Labels | Description |", "| --- | --- | --- | --- |"]
        for name, kind, labels, documentation in series:
            suffix = EXPOSED_SUFFIX[kind]
            exposed = f"`{name}{suffix}`" if kind == "counter" else f"`{name}`"
            if kind == "histogram":
                exposed += f" ({suffix})"
            label_text = ", ".join(f"`{label}`" for label in labels) or "none"
            out.append(f"| {exposed} | {kind} | {label_text} | {markdown_text(documentation)} |")
        out.append("")
    return "\n".join(out)


# The console's HTTP routes


def http_routes() -> list[tuple[str, str]]:
    """(method, path) of the console's JSON API and health routes, from the
    app itself: building it connects to nothing (connections open on use)."""
    from starlette.routing import Route

    from rota.dashboard.app import create_app
    from rota.settings import Settings

    # model_construct: the defaults, not this machine's ROTA_* variables.
    app = create_app(Settings.model_construct())
    found = []
    for route in app.routes:
        if not isinstance(route, Route):
            continue
        if route.path.startswith("/api/") or route.path in ("/metrics", "/healthz", "/readyz"):
            methods = sorted((route.methods or {"GET"}) - {"HEAD"})
            found += [(method, route.path) for method in methods]
    return found


def http_scope(method: str, path: str) -> str:
    """The token scope a route needs (rota.dashboard.app routes them so)."""
    if path in ("/healthz", "/readyz"):
        return "none"
    if path == "/metrics":
        return "`metrics`"
    if method == "GET":
        return "`read`"
    return "`enqueue`" if path == "/api/tasks" else "`act`"


def http_reference() -> str:
    lines = ["| Method | Path | Token scope |", "| --- | --- | --- |"]
    lines += [f"| {m} | `{p}` | {http_scope(m, p)} |" for m, p in http_routes()]
    return "\n".join(lines) + "\n"


GENERATED: dict[str, Callable[[], str]] = {
    "<!-- generated: settings -->": settings_reference,
    "<!-- generated: cli -->": cli_reference,
    "<!-- generated: metrics -->": metrics_reference,
    "<!-- generated: http -->": http_reference,
}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs hook: each marker replaced by its generated Markdown."""
    for marker, generate in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, generate())
    return markdown
