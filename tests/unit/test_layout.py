"""The package's layout, checked: what may import what, and file sizes."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import rota

PACKAGE = Path(rota.__file__).parent
ROOT = PACKAGE.parent

MAX_LINES = 450


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


def test_the_import_contracts_hold() -> None:
    """import-linter's contracts (pyproject.toml, [tool.importlinter]): the
    layers, no cycle, no import of the tools or of Redis where they have no
    business. `make lint` runs the same."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tools")])},
    )
    assert done.returncode == 0, done.stdout + done.stderr


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


def test_no_runtime_file_is_long() -> None:
    long = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in _runtime_files()
    }
    assert {name: n for name, n in long.items() if n > MAX_LINES} == {}


def test_the_top_level_is_grouped() -> None:
    """Top-level modules are the public face (the app, tasks, a running task's
    context, result, errors; and the settings, a package whose fields are grouped
    by what they tune); everything else lives in a package named for what it serves."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == [
        "__init__",
        "__main__",
        "app",
        "context",
        "errors",
        "result",
        "task",
        "workflow",
    ]
