"""Rows read by column name (rota.core.rows), and no query result read by
position in the code that reads them."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest

import rota
from rota.core.rows import ONLY, Both, ColumnError, Rows

PACKAGE = Path(rota.__file__).parent


class Pair(NamedTuple):
    id: int
    name: str


@dataclass(frozen=True)
class Task:
    id: int
    name: str
    cost: float = 1.0
    note: str | None = None


def test_rows_are_built_by_name_whatever_the_columns_order() -> None:
    rows = Rows(Pair).build(["name", "id"], [("a", 1), ("b", 2)])
    assert rows == [Pair(1, "a"), Pair(2, "b")]
    assert Rows(Pair).build(["id", "name"], []) == []


def test_fields_with_a_default_may_be_absent_and_conversions_apply_by_name() -> None:
    rows = Rows(Task, cost=float).build(["note", "id", "name"], [("n", 1, "a")])
    assert rows == [Task(1, "a", 1.0, "n")]
    (costly,) = Rows(Task, cost=float).build(["cost", "name", "id"], [(2, "b", 7)])
    assert costly == Task(7, "b", 2.0) and isinstance(costly.cost, float)


def test_a_function_reads_the_columns_named_as_its_parameters() -> None:
    def make(id: int, name: str, cost: float = 0.5) -> Task:
        return Task(id, name.upper(), cost)

    assert Rows(make).build(["name", "id"], [("a", 1)]) == [Task(1, "A", 0.5)]
    assert Rows(int, ["total"]).build(["total"], [(3,)]) == [3]


@pytest.mark.parametrize(
    ("columns", "complaint"),
    [
        (["id"], "missing ['name']"),  # a field without a column
        (["id", "name", "extra"], "read by nothing ['extra']"),  # a column no field reads
        (["id", "name", "id"], "named twice ['id']"),  # say, two unaliased q.name, tn.name
    ],
)
def test_columns_that_do_not_match_the_row_are_an_error(columns: list[str], complaint: str) -> None:
    with pytest.raises(ColumnError, match=complaint.replace("[", r"\[")):
        Rows(Pair).build(columns, [])


def test_columns_left_unread_are_named() -> None:
    assert Rows(Pair, extra=["at"]).build(["at", "id", "name"], [(0, 1, "a")]) == [Pair(1, "a")]


def test_a_row_read_as_two_things_reads_every_column_between_them() -> None:
    class Kept(NamedTuple):
        seq: int

    both = Both(Rows(Task), Rows(Kept))
    assert both.build(["seq", "name", "id"], [(9, "a", 1)]) == [(Task(1, "a"), Kept(9))]
    with pytest.raises(ColumnError, match="nothing"):
        both.build(["seq", "name", "id", "stray"], [(9, "a", 1, 0)])


def test_a_single_value_statement_has_one_column() -> None:
    assert ONLY.build(["promote_due"], [(3,), (4,)]) == [3, 4]
    with pytest.raises(ColumnError):
        ONLY.build(["id", "status"], [])


# -- no positional read of a query result ------------------------------------

# The code that reads rows: the queue core, a task's story, a worker's
# reports, the dead letters.
READERS = [
    *sorted((PACKAGE / "core").glob("*.py")),
    PACKAGE / "readmodel" / "story.py",
    PACKAGE / "consumer" / "reports.py",
    PACKAGE / "buffer" / "deadletters.py",
]
FETCHES = {"fetchone", "fetchall", "fetchmany", "execute"}


def _is_result(node: ast.expr) -> bool:
    """A statement's rows: what an operation's yield receives, or a fetch."""
    if isinstance(node, ast.Await):
        node = node.value
    if isinstance(node, ast.Yield | ast.YieldFrom):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in FETCHES
    )


def _positional(index: ast.expr) -> bool:
    if isinstance(index, ast.UnaryOp):
        index = index.operand
    return isinstance(index, ast.Slice) or (
        isinstance(index, ast.Constant) and isinstance(index.value, int)
    )


def positional_reads(source: str) -> list[str]:
    """Reads by position of a statement's result, in each function: an
    integer index or a slice of the result, of a name bound to it, or of a
    row iterated from it (`rows[0][1]`, `row[2]`, `*row[3:]`), and a row's
    columns unpacked in place (`((a, b),) = yield ...`). Plain unpacking
    (`a, b = row`) is not told apart from other tuples, and not caught."""
    found: list[str] = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        results: set[str] = set()
        nodes = list(ast.walk(function))
        for _ in range(2):  # rows iterated from a name bound later in the text
            for node in nodes:
                if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if _is_result(node.value) or _names(node.value) & results:
                        results |= {t.id for t in targets if isinstance(t, ast.Name)}
                    found += [
                        "unpacked: " + ast.unparse(t)
                        for t in targets
                        if _nested(t) and _is_result(node.value)
                    ]
                elif isinstance(node, ast.comprehension | ast.For) and (
                    _is_result(node.iter) or _names(node.iter) & results
                ):
                    results |= _names(node.target)
        inside: set[int] = set()  # of a longer read, reported whole
        for node in nodes:
            if isinstance(node, ast.Subscript) and _positional(node.slice):
                inner = node.value
                while isinstance(inner, ast.Subscript):
                    inside.add(id(inner))
                    inner = inner.value
                if id(node) not in inside and (
                    _is_result(inner) or (isinstance(inner, ast.Name) and inner.id in results)
                ):
                    found.append(ast.unparse(node))
    return sorted(set(found))


def _names(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Tuple | ast.List):
        return set().union(*(_names(e) for e in node.elts))
    return set()


def _nested(target: ast.expr) -> bool:
    return isinstance(target, ast.Tuple | ast.List) and any(
        isinstance(e, ast.Tuple | ast.List) for e in target.elts
    )


def test_the_check_finds_the_positional_reads_it_is_for() -> None:
    source = """
def op():
    rows = yield Execute(query("x"))
    ((count,),) = yield Execute(query("y"))
    first = rows[0]
    return [Task(r[0], *r[3:]) for r in rows], first, count

def tokens():
    return [(row[0], row[-1]) for row in (yield from held())]

def migrate(conn):
    exists = conn.execute(query("z")).fetchone()
    return exists[0], conn.execute(query("w")).fetchall()[0][1]

def fine(items, task):
    rows = yield from select(query("x"), None, ROWS)
    return items[0], task.token[0], [row.id for row in rows]
"""
    assert positional_reads(source) == [
        "conn.execute(query('w')).fetchall()[0][1]",
        "exists[0]",
        "r[0]",
        "r[3:]",
        "row[-1]",
        "row[0]",
        "rows[0]",
        "unpacked: ((count,),)",
    ]


@pytest.mark.parametrize("path", READERS, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_query_result_is_read_by_position(path: Path) -> None:
    """Rows are read by column name (rota.core.rows): an operation asks for
    its rows as a class, or for a one-column statement's values."""
    assert positional_reads(path.read_text()) == []
