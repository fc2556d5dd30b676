"""The benchmarks' modules share what they share through the harness
(rota_tools.bench.harness): no module of rota_tools.bench reaches into
another's private names (pyproject.toml's import-linter contract keeps the
direction of their imports)."""

from __future__ import annotations

import ast
from pathlib import Path

import rota_tools.bench

BENCH = Path(rota_tools.bench.__file__).parent


def private_imports(path: Path) -> list[str]:
    """`from rota_tools.bench.X import _name` and `X._name` of a bench module
    X imported whole, in the module at `path` (X not the module itself)."""
    own = f"rota_tools.bench.{path.stem}"
    tree = ast.parse(path.read_text(), filename=str(path))
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "rota_tools.bench":
                modules |= {alias.asname or alias.name for alias in node.names}
                found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            elif node.module.startswith("rota_tools.bench.") and node.module != own:
                found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("rota_tools.bench.") and alias.name != own:
                    modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        private = isinstance(node, ast.Attribute) and node.attr.startswith("_")
        if private and not node.attr.startswith("__") and ast.unparse(node.value) in modules:
            found.append(f"{ast.unparse(node.value)}.{node.attr}")
    return found


def test_no_bench_module_imports_a_private_name_of_another() -> None:
    modules = sorted(BENCH.rglob("*.py"))
    assert len(modules) > 20
    assert {path.name: private_imports(path) for path in modules if private_imports(path)} == {}


def test_the_check_sees_both_forms(tmp_path: Path) -> None:
    module = tmp_path / "scenario.py"
    module.write_text(
        "from rota_tools.bench.harness import reset, _hidden\n"
        "from rota_tools.bench import claim\n"
        "claim._queue_for(3)\n"
        "from rota_tools.bench.scenario import _own\n"
    )
    assert private_imports(module) == [
        "rota_tools.bench.harness._hidden",
        "claim._queue_for",
    ]
