"""`rota import` checks rows a batch at a time, over Arrow columns
(rota.loader.columns): every row's outcome must be `validate_row`'s, the
producer's rules applied to one row, whatever the batch holds."""

from __future__ import annotations

import json
import math
import sys
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")

from rota.loader.columns import check_batch, records  # noqa: E402
from rota.loader.rows import ETA_MICROS, reason_of, validate_row  # noqa: E402
from rota.model.rules import EARLIEST, LATEST  # noqa: E402

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NOW = datetime(2026, 11, 26, tzinfo=UTC)


def _micros(at: datetime) -> int:
    return (at - EPOCH) // timedelta(microseconds=1)


NAMES = ["app.parse", "a", "A_b.c:d", "x" * 200, "x" * 201, "", "1bad", "not a name!", "é", "a."]
TENANTS = ["alice", "bob", "t1", "a:b@c-d.e_f", "x" * 128, "x" * 129, "", "bad tenant", "_x", "ü"]
QUEUES = ["default", "pdfs", "", "Bad", "q" * 63, "q" * 64, "other", "1q"]
KEYS = ["", "k", "k" * 1024, "k" * 1025, "ключ", "a:b"]
ARGS_TEXT = [
    "[]",
    "[1,2]",
    "[1, 2]",
    '["a","b c"]',
    '["é", "\\u00e9"]',
    '["\x7f"]',
    "[true,false,null]",
    "[-0]",
    "[01]",
    "[1.5]",
    "[1e3]",
    "[NaN]",
    "[Infinity]",
    f"[{2**63 - 1}]",
    f"[{2**64}]",
    f"[{10**18}]",
    "[[1,[2]],{}]",
    '{"a":1}',
    "5",
    "",
    "[not json",
    '["' + "p" * 60 + '"]',
    '["tab\there"]',
]
KWARGS_TEXT = ["{}", '{"x":1}', '{"x": 1}', '{"a":1,"a":2}', "[]", "", "{", "null"]
COST_FLOATS = [0.0, 1.0, 0.5, 1e6, math.nextafter(1e6, math.inf), -1.0, 5e-324]
COST_FLOATS += [math.nan, math.inf, -math.inf, 1e300]
COST_TEXT = ["1", "2.5", " 2", "1e3", "nan", "inf", "", "0", "1000000", "1000000.0000001"]
COST_TEXT += ["0.1", "٣", "+1", "1_0", "007.25", "0.30000000000000004"]
INT_TEXT = ["3", "03", "+3", " 3", "3.0", "", "0", "1", "9", "10", "10000", "10001", "٣", "-1"]
ETA_TEXT = [
    "2030-01-01T00:00:00+00:00",
    "2030-01-01T00:00:00+05:30",
    "2030-01-01T00:00:00",
    "2030-01-01",
    "",
    "garbage",
    "1999-12-31T23:59:59.999999+00:00",
    "2000-01-01T00:00:00+00:00",
    "2199-12-31T23:59:59.999999+00:00",
    "2200-01-01T00:00:00+00:00",
]
MICROS = [
    _micros(EARLIEST) - 1,
    _micros(EARLIEST),
    _micros(LATEST) - 1,
    _micros(LATEST),
    _micros(NOW),
    -(2**63),
    2**63 - 1,
]


def _maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), values)


def _text(sampled: list[str]) -> st.SearchStrategy[Any]:
    return _maybe(st.one_of(st.sampled_from(sampled), st.text(max_size=12)))


def _compact_args() -> st.SearchStrategy[str]:
    scalar = st.one_of(
        st.integers(-(2**64), 2**64),
        st.text(max_size=8),
        st.booleans(),
        st.none(),
        st.floats(allow_nan=False, allow_infinity=False),
    )
    nested = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3), max_leaves=6)
    return st.builds(
        lambda values, compact, ascii_only: json.dumps(
            values,
            separators=(",", ":") if compact else None,
            ensure_ascii=ascii_only,
        ),
        st.lists(nested, max_size=4),
        st.booleans(),
        st.booleans(),
    )


# Each column: how it may be typed in a file, and the values of that type.
COLUMNS: dict[str, list[tuple[Any, st.SearchStrategy[Any]]]] = {
    "name": [(pa.string(), _text(NAMES)), (pa.int64(), _maybe(st.integers(-5, 5)))],
    "tenant": [(pa.string(), _text(TENANTS)), (pa.large_string(), _text(TENANTS))],
    "queue": [(pa.string(), _text(QUEUES))],
    "idempotency_key": [
        (pa.string(), _text(KEYS)),
        (pa.int64(), _maybe(st.integers(-1, 2))),
    ],
    "args": [
        (pa.string(), _maybe(st.one_of(st.sampled_from(ARGS_TEXT), _compact_args()))),
        (pa.list_(pa.int64()), _maybe(st.lists(_maybe(st.integers(-(2**63), 2**63 - 1))))),
    ],
    "kwargs": [
        (pa.string(), _text(KWARGS_TEXT)),
        (
            pa.map_(pa.string(), pa.int64()),
            _maybe(st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2)),
        ),
        (
            pa.struct([("x", pa.int64())]),
            _maybe(st.fixed_dictionaries({"x": _maybe(st.integers(-(2**63), 2**63 - 1))})),
        ),
    ],
    "cost": [
        (pa.float64(), _maybe(st.one_of(st.sampled_from(COST_FLOATS), st.floats()))),
        (pa.float32(), _maybe(st.floats(width=32))),
        (pa.int64(), _maybe(st.integers(-2, 2_000_000))),
        (pa.uint64(), _maybe(st.sampled_from([0, 1, 1_000_000, 2**64 - 1]))),
        (pa.string(), _text(COST_TEXT)),
        (pa.bool_(), _maybe(st.booleans())),
    ],
    "max_attempts": [
        (pa.int64(), _maybe(st.sampled_from([0, 1, 3, 10_000, 10_001, -5, 2**63 - 1]))),
        (pa.uint64(), _maybe(st.sampled_from([0, 1, 10_000, 2**64 - 1]))),
        (pa.int8(), _maybe(st.integers(-128, 127))),
        (pa.float64(), _maybe(st.sampled_from([3.0, 0.5, math.nan]))),
        (pa.string(), _text(INT_TEXT)),
        (pa.bool_(), _maybe(st.booleans())),
    ],
    "priority": [
        (pa.int64(), _maybe(st.integers(-2, 12))),
        (pa.int16(), _maybe(st.integers(-2, 12))),
        (pa.string(), _text(INT_TEXT)),
        (pa.float64(), _maybe(st.sampled_from([1.0, 9.5]))),
    ],
    "eta": [
        (pa.string(), _text(ETA_TEXT)),
        (pa.int64(), _maybe(st.integers(0, 10))),
        (pa.timestamp("us", "UTC"), _maybe(st.sampled_from(MICROS[:5]))),
    ],
    ETA_MICROS: [(pa.int64(), _maybe(st.sampled_from(MICROS)))],
}
REQUIRED = ("name", "tenant")
GOOD = {
    "name": (pa.string(), st.sampled_from(["app.parse", "a", "A_b.c:d"])),
    "tenant": (pa.string(), st.sampled_from(["alice", "bob", "a:b@c-d.e_f"])),
    "queue": (pa.string(), st.sampled_from([None, "", "default", "pdfs"])),
}


@st.composite
def batches(draw: st.DrawFn) -> pa.RecordBatch:
    rows = draw(st.integers(1, 12))
    present = [c for c in COLUMNS if c in REQUIRED or draw(st.booleans())]
    if "eta" in present and ETA_MICROS in present:  # the import gives one or the other
        present.remove(draw(st.sampled_from(["eta", ETA_MICROS])))
    arrays, fields = [], []
    mostly_good = draw(st.booleans())  # else most rows fail on their name or tenant
    for column in present:
        kind, values = draw(st.sampled_from(COLUMNS[column]))
        if mostly_good and column in GOOD:
            kind, values = GOOD[column]
        data = draw(st.lists(values, min_size=rows, max_size=rows))
        if pa.types.is_map(kind):
            data = [None if d is None else list(d.items()) for d in data]
        arrays.append(pa.array(data, type=kind))
        fields.append(pa.field(column, kind))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


@st.composite
def defaults(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "allowed_queues": draw(st.sampled_from([None, ["default", "pdfs"], ["pdfs"]])),
        "queue": "default",
        "max_attempts": draw(st.sampled_from([3, 1, 10_000])),
        "max_payload_bytes": draw(st.sampled_from([24, 30, 64, 256 * 1024])),
    }


def _agree(batch: pa.RecordBatch, defaults: dict[str, Any]) -> None:
    unkeyed = [i.to_bytes(16, "big") for i in range(1, batch.num_rows + 1)]
    checked = check_batch(batch, defaults, unkeyed, NOW, reason_of)
    accepted = dict(zip(checked.rows, range(len(checked.rows)), strict=True))
    rejected = dict(checked.rejected)
    assert not accepted.keys() & rejected.keys()
    tasks = checked.tasks
    for i, record in enumerate(records(batch, list(range(batch.num_rows)))):
        try:
            expected = validate_row(record, defaults, UUID(bytes=unkeyed[i]))
        except Exception as exc:
            assert rejected.get(i) == reason_of(exc), (i, record)
            continue
        assert i in accepted, (i, record, rejected.get(i))
        j = accepted[i]
        got = tasks.envelope(j)
        assert (got.id, got.queue, got.tenant, got.name, got.payload) == (
            expected.id,
            expected.queue,
            expected.tenant,
            expected.name,
            expected.payload,
        ), record
        assert type(got.cost) is float and got.cost == expected.cost, record
        assert type(got.max_attempts) is int and got.max_attempts == expected.max_attempts
        assert type(got.priority) is int and got.priority == expected.priority, record
        assert got.eta == expected.eta, record
        assert (got.backoff_base, got.backoff_max) == (expected.backoff_base, expected.backoff_max)
    assert len(accepted) + len(rejected) == batch.num_rows


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), defaults())
def test_the_column_check_and_validate_row_agree_on_every_row(
    batch: pa.RecordBatch, defaults: dict[str, Any]
) -> None:
    _agree(batch, defaults)


DEFAULTS = {"allowed_queues": None, "queue": "default", "max_attempts": 3, "max_payload_bytes": 64}


@pytest.mark.parametrize(
    "columns",
    [
        # Bounds exactly at the limits, and just past them.
        {"cost": pa.array([1e6, math.nextafter(1e6, 2e6), 5e-324, 0.0, -0.0])},
        {"cost": pa.array(["1000000", "1000000.0000000001", "0.0", "1e-300", "nan"])},
        {"max_attempts": pa.array([1, 10_000, 0, 10_001, None])},
        {"priority": pa.array([0, 9, -1, 10, None], pa.int8())},
        {ETA_MICROS: pa.array([_micros(EARLIEST), _micros(LATEST) - 1, _micros(LATEST), None, -1])},
        # NaN and infinities, as numbers and inside arguments.
        {"cost": pa.array([math.nan, math.inf, -math.inf, 1.0, None])},
        {"args": pa.array(["[NaN]", "[Infinity]", "[1e999]", "[-1e999]", "[null]"])},
        # Empty strings everywhere.
        {
            "args": pa.array(["", "[]", None, '[""]', " "]),
            "kwargs": pa.array(["", "{}", None, "{}", "{ }"]),
        },
        {
            "queue": pa.array(["", None, "pdfs", "", "x"]),
            "idempotency_key": pa.array(["", None, "k", "", "k"]),
        },
        # Unicode, escaped and not, and payloads at the cap (64 bytes).
        {
            "args": pa.array(
                ['["é"]', '["\\u00e9"]', '["🙂"]', '["' + "a" * 38 + '"]', '["' + "a" * 39 + '"]']
            )
        },
        # Nested arguments, and arguments as Parquet lists and kwargs as maps.
        {"args": pa.array(["[[1,[2,[3]]]]", '[{"a":[1]}]', "[[]]", "[{}]", '[[1, "x"]]'])},
        {
            "args": pa.array([[1, 2], None, [], [2**63 - 1], [-(2**63)]], pa.list_(pa.int64())),
            "kwargs": pa.array(
                [[("a", 1)], None, [], [("a", 1), ("b", 2)], [("", 0)]],
                pa.map_(pa.string(), pa.int64()),
            ),
        },
        # Integers as CSV text.
        {
            "max_attempts": pa.array(["5", "05", "+5", " 5", "5.0"]),
            "priority": pa.array(["9", "10", "٣", "", None]),
        },
        # Etas as text.
        {"eta": pa.array(ETA_TEXT[:5])},
        {"eta": pa.array(ETA_TEXT[5:])},
    ],
    ids=lambda columns: ",".join(columns),
)
def test_edge_cases_agree(columns: dict[str, Any]) -> None:
    rows = 5
    base = {
        "name": pa.array(["app.parse", "app.parse", "bad name", "app.parse", "app.parse"]),
        "tenant": pa.array(["alice", "bob", "alice", "carol", "dave"]),
    }
    assert all(len(array) == rows for array in columns.values())
    batch = pa.RecordBatch.from_pydict({**base, **columns})
    _agree(batch, DEFAULTS)


def test_absent_columns_take_the_defaults() -> None:
    batch = pa.RecordBatch.from_pydict({"name": ["app.parse"], "tenant": ["alice"]})
    checked = check_batch(batch, DEFAULTS, [b"\x01" * 16], NOW, reason_of)
    assert checked.rejected == [] and checked.rows == [0]
    task = checked.tasks.envelope(0)
    assert (task.queue, task.payload, task.cost, task.max_attempts, task.priority, task.eta) == (
        "default",
        '{"args":[],"kwargs":{}}',
        1.0,
        3,
        0,
        None,
    )
    _agree(batch, DEFAULTS)
    no_tenant = pa.RecordBatch.from_pydict({"name": ["app.parse"]})
    [(row, reason)] = check_batch(no_tenant, DEFAULTS, [b"\x01" * 16], NOW, reason_of).rejected
    assert row == 0 and "tenant" in reason


def test_common_rows_are_settled_without_validate_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vector path is what runs for ordinary rows, not the fallback."""
    import rota.loader.columns as columns

    def refuse(*_: Any) -> Any:
        raise AssertionError("validate_row ran on a common row")

    monkeypatch.setattr(columns, "validate_row", refuse)
    n = 1000
    batch = pa.RecordBatch.from_pydict(
        {
            "name": ["app.parse"] * n,
            "tenant": [f"t{i % 7}" for i in range(n)],
            "args": [f"[{i}]" for i in range(n)],
            "cost": ["1.5"] * n,
            "priority": [str(i % 10) for i in range(n)],
            "idempotency_key": [f"k{i}" if i % 2 else None for i in range(n)],
            ETA_MICROS: [_micros(NOW) if i % 3 else None for i in range(n)],
        }
    )
    unkeyed = [i.to_bytes(16, "big") for i in range(n)]
    checked = check_batch(batch, DEFAULTS, unkeyed, NOW, reason_of)
    assert len(checked.rows) == n and not checked.rejected
    assert checked.tasks.payloads[7] == '{"args":[7],"kwargs":{}}'
    assert sys.getsizeof(checked) > 0


def test_a_batch_the_columns_cannot_read_is_checked_row_by_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rota.loader.columns as columns

    def broken(*_: Any) -> Any:
        raise pa.ArrowInvalid("a column the checks cannot read")

    monkeypatch.setattr(columns, "_queues", broken)
    batch = pa.RecordBatch.from_pydict(
        {"name": ["app.parse", "bad name", "app.parse"], "tenant": ["alice", "bob", "bad tenant"]}
    )
    checked = check_batch(
        batch, DEFAULTS, [b"\x01" * 16, b"\x02" * 16, b"\x03" * 16], NOW, reason_of
    )
    assert checked.rows == [0] and [i for i, _ in checked.rejected] == [1, 2]
    _agree(batch, DEFAULTS)
