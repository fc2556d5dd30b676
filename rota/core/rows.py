"""Statements' rows read by column name, never by position.

An operation says what its rows are (`Rows(ClaimedTask)`); the driver
(rota.core.db) matches the result's column names (cursor.description) to
the fields once per result and builds every row from them. A field without
a column, a column no field reads, or a name given twice is an error.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Collection, Sequence
from operator import itemgetter
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

Row: TypeAlias = tuple[Any, ...]  # as psycopg returns it
R = TypeVar("R")
S = TypeVar("S")


# The fields a result gives, and how to take each one's values from a row.
_Plan: TypeAlias = tuple[
    tuple[str, ...], tuple[tuple[Callable[[Row], Any], Callable[[Any], Any] | None], ...]
]


class Shape(Protocol[R]):
    """What a statement's rows are: built from the result's column names and its rows."""

    def build(self, columns: Sequence[str], rows: list[Row]) -> list[R]: ...


class ColumnError(LookupError):
    """A statement's columns do not match the row it is read as."""


class Rows(Generic[R]):
    """Rows made by `make` (a class, or a function) from the columns named as
    its fields (a dataclass's or NamedTuple's fields, a function's parameters,
    or `fields`); `convert` maps a field to a function applied to its values,
    and `extra` names columns of the statement left unread."""

    def __init__(
        self,
        make: Callable[..., R],
        fields: Sequence[str] | None = None,
        *,
        extra: Collection[str] = (),
        **convert: Callable[[Any], Any],
    ) -> None:
        self.make = make
        self.fields, self.required = (tuple(fields), set(fields)) if fields else _fields_of(make)
        if not set(convert) <= set(self.fields):
            raise ValueError(f"conversions of no field: {sorted(set(convert) - set(self.fields))}")
        self.convert = convert
        self.extra = frozenset(extra)
        # Per result's column names (and columns left to others): the plan.
        self._plans: dict[tuple[tuple[str, ...], frozenset[str]], _Plan] = {}

    def build(self, columns: Sequence[str], rows: list[Row]) -> list[R]:
        return self.read(columns, rows, self.extra)

    def read(self, columns: Sequence[str], rows: list[Row], unread: frozenset[str]) -> list[R]:
        """The rows, the columns in `unread` left to others."""
        names, takes = self._plan(tuple(columns), unread)
        if not rows:
            return []
        # Column by column: every value is taken and converted in C loops,
        # so a row costs no more than one built by position.
        values = [
            map(take, rows) if convert is None else map(convert, map(take, rows))
            for take, convert in takes
        ]
        if names == self.fields[: len(names)]:  # the leading fields, in order
            return list(map(self.make, *values))
        return [
            self.make(**dict(zip(names, row, strict=True))) for row in zip(*values, strict=True)
        ]

    def _plan(self, columns: tuple[str, ...], unread: frozenset[str]) -> _Plan:
        plan = self._plans.get((columns, unread))
        if plan is None:
            plan = self._plans[columns, unread] = self._match(columns, unread)
        return plan

    def _match(self, columns: tuple[str, ...], unread: frozenset[str]) -> _Plan:
        twice = sorted({c for c in columns if columns.count(c) > 1} & set(self.fields))
        missing = sorted(self.required - set(columns))
        unknown = sorted(set(columns) - set(self.fields) - unread)
        if twice or missing or unknown:
            name = getattr(self.make, "__name__", repr(self.make))
            raise ColumnError(
                f"{name} from columns ({', '.join(columns)}): "
                f"named twice {twice}, missing {missing}, read by nothing {unknown}"
            )
        names = tuple(f for f in self.fields if f in columns)
        takes = tuple((itemgetter(columns.index(f)), self.convert.get(f)) for f in names)
        return names, takes


class Both(Generic[R, S]):
    """Each row read as two things (a task, and where it is kept); between
    them they read every column."""

    def __init__(self, first: Rows[R], second: Rows[S]) -> None:
        self.first, self.second = first, second
        unread = first.extra | second.extra
        self._first_leaves = frozenset(second.fields) | unread
        self._second_leaves = frozenset(first.fields) | unread

    def build(self, columns: Sequence[str], rows: list[Row]) -> list[tuple[R, S]]:
        firsts = self.first.read(columns, rows, self._first_leaves)
        seconds = self.second.read(columns, rows, self._second_leaves)
        return list(zip(firsts, seconds, strict=True))


class Only:
    """The values of a statement's only column."""

    def build(self, columns: Sequence[str], rows: list[Row]) -> list[Any]:
        if len(columns) != 1:
            raise ColumnError(f"one column expected, got ({', '.join(columns)})")
        return [value for (value,) in rows]


ONLY = Only()


def _fields_of(make: Callable[..., Any]) -> tuple[tuple[str, ...], set[str]]:
    """The fields of a dataclass, a NamedTuple or a function, and those
    without a default."""
    if dataclasses.is_dataclass(make):
        fields = dataclasses.fields(make)
        absent = dataclasses.MISSING
        required = {f.name for f in fields if f.default is absent and f.default_factory is absent}
        return tuple(f.name for f in fields), required
    names = getattr(make, "_fields", None)
    if names is not None:
        defaults = getattr(make, "_field_defaults", {})
        return tuple(names), set(names) - set(defaults)
    parameters = inspect.signature(make).parameters.values()
    empty = inspect.Parameter.empty
    return tuple(p.name for p in parameters), {p.name for p in parameters if p.default is empty}


def optional_float(value: Any) -> float | None:
    """A column's number as a float, NULL as None (a field's converter)."""
    return None if value is None else float(value)
