"""The package's layout, checked: what may import what, and file sizes."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rota

PACKAGE = Path(rota.__file__).parent
ROOT = PACKAGE.parent

# Runtime files allowed past the size limit, each with its reason.
LONG_FILES: dict[str, str] = {
    "app.py": "the App: the task registry and every enqueue entry point, sync and async",
    "consumer/worker.py": "the worker's one loop and the state its threads share: claims,"
    " runs, cancels, reports, shutdown",
    "settings.py": "the one settings class: every field with the description the"
    " settings reference is generated from",
}
MAX_LINES = 420  # "about 400"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _runtime_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _importers(prefix: str, among: list[Path]) -> list[str]:
    return [
        _module(path)
        for path in among
        if any(name == prefix or name.startswith(prefix + ".") for name in _imports(path))
    ]


def test_the_runtime_never_imports_benchmarks_demo_or_servers() -> None:
    assert _importers("rota_tools", _runtime_files()) == []


def test_the_consumer_does_not_import_the_producer() -> None:
    consumer = sorted((PACKAGE / "consumer").rglob("*.py"))
    assert consumer
    assert _importers("rota.producer", consumer) == []
    assert _importers("redis", consumer) == []


def test_the_spark_engine_does_not_import_the_python_engine() -> None:
    assert _importers("rota.loader.engine", [PACKAGE / "loader" / "spark.py"]) == []


def test_loading_the_consumer_or_an_app_loads_no_redis_client() -> None:
    probe = (
        "import sys, rota, rota.consumer, rota.app; "
        "print(sorted(m for m in sys.modules if m == 'redis' or m.startswith(('rota.producer', "
        "'rota_tools'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_sql_is_run_by_name_only_in_the_operations_and_migrations() -> None:
    callers = [
        _module(path)
        for path in _runtime_files()
        if "rota.sql.query" in _imports(path) and not _module(path).startswith("rota.core")
    ]
    assert callers == []


def test_no_runtime_file_is_long_without_a_reason() -> None:
    long = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in _runtime_files()
    }
    over = {name: n for name, n in long.items() if n > MAX_LINES and name not in LONG_FILES}
    assert over == {}
    stale = [name for name in LONG_FILES if long.get(name, 0) <= MAX_LINES]
    assert stale == [], "allowed long files that are not long any more"


def _graph() -> dict[str, set[str]]:
    modules = {_module(path): path for path in _runtime_files()}
    return {
        name: {other for other in _imports(path) if other in modules and other != name}
        for name, path in modules.items()
    }


def test_no_import_cycles() -> None:
    """No module imports, at any depth, one that imports it back (a package's
    __init__ re-exporting its own modules aside)."""
    graph = _graph()
    cycles = []
    for start in graph:
        seen: set[str] = set()
        stack = list(graph[start])
        while stack:
            name = stack.pop()
            if name == start:
                cycles.append(start)
                break
            if name in seen:
                continue
            seen.add(name)
            stack.extend(
                n for n in graph[name] if not (n.startswith(name + ".") or name.startswith(n + "."))
            )
    assert cycles == []


def test_the_top_level_is_grouped() -> None:
    """Top-level modules are the public face (the app, tasks, a running task's
    context, result, settings, errors); everything else lives in a package named for
    what it serves."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == [
        "__init__",
        "__main__",
        "app",
        "context",
        "errors",
        "result",
        "settings",
        "task",
        "workflow",
    ]
