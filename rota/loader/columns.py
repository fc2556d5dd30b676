"""`rota import`'s rows checked a batch at a time, over Arrow columns.

The rules are the producer's (rota.model.rules), applied as `validate_row`
applies them to one row. Cheap column checks decide the common rows: names
by their distinct values (each checked once by the rule itself), numbers by
ranges over the column, arguments by a pattern that only JSON already in
orjson's compact form matches (then the payload is that text, joined).
Every row they do not pass goes through `validate_row` itself, so that each
row's outcome, accepted with its fields or refused with its reason, is
exactly `validate_row`'s (tests/unit/test_import_columns.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from rota.core.load import TaskColumns
from rota.loader.rows import ETA_MICROS, import_columns, json_value, validate_row
from rota.model.envelope import TaskEnvelope, dump_payload, task_id_for_key
from rota.model.rules import (
    EARLIEST,
    IDEMPOTENCY_KEY_MAX,
    LATEST,
    MAX_ATTEMPTS,
    MAX_COST,
    MAX_PRIORITY,
    MIN_PRIORITY,
    check_max_attempts,
    check_priority,
    check_queue,
    check_task_name,
    check_tenant,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EARLIEST_US = (EARLIEST - _EPOCH) // timedelta(microseconds=1)
_LATEST_US = (LATEST - _EPOCH) // timedelta(microseconds=1)

# JSON text that orjson writes back unchanged: no whitespace, integers of at
# most 18 digits (no "-0", no leading zeros: they fit in 64 bits and print as
# read), strings without escapes or control characters, true, false, null.
# A flat array of those is its own compact form, so the payload can be built
# from the text without parsing it.
_SCALAR = r'(?:0|-?[1-9][0-9]{0,17}|"[^"\\\x00-\x1f]*"|true|false|null)'
_COMPACT_ARRAY = rf"\A\[(?:{_SCALAR}(?:,{_SCALAR})*)?\]\z"
# CSV numbers as text that int() and float() read as the column cast does:
# plain decimal digits, nothing else (signs, spaces, exponents go row by row).
_INTEGER_TEXT = r"\A[0-9]{1,9}\z"
_DECIMAL_TEXT = r"\A[0-9]{1,9}(?:\.[0-9]{1,17})?\z"


_RANGES: dict[Callable[[Any], Any], tuple[int, int]] = {
    check_max_attempts: (1, MAX_ATTEMPTS),
    check_priority: (MIN_PRIORITY, MAX_PRIORITY),
}


@dataclass
class CheckedBatch:
    """A batch's accepted rows, column by column in the batch's order, with
    their places in the batch (`rows`), and each refused row's place and reason."""

    tasks: TaskColumns
    rows: list[int]
    rejected: list[tuple[int, str]]


def check_batch(
    batch: pa.RecordBatch,
    defaults: Mapping[str, Any],
    unkeyed: Sequence[bytes],
    now: datetime,
    reason: Callable[[BaseException], str],
) -> CheckedBatch:
    """Checks a batch of imported rows as `validate_row` checks each: the
    accepted ones as task columns (ids: `unkeyed[i]` for row i without an
    idempotency key), the refused ones with `reason(exception)`."""
    try:
        return _check_columns(batch, defaults, unkeyed, now, reason)
    except Exception:  # a column the checks cannot read: every row by the rules themselves
        return _row_by_row(batch, defaults, unkeyed, now, reason)


def _row_by_row(
    batch: pa.RecordBatch,
    defaults: Mapping[str, Any],
    unkeyed: Sequence[bytes],
    now: datetime,
    reason: Callable[[BaseException], str],
) -> CheckedBatch:
    good: list[TaskEnvelope] = []
    rows: list[int] = []
    rejected: list[tuple[int, str]] = []
    for i, record in enumerate(records(batch, np.arange(batch.num_rows))):
        try:
            good.append(validate_row(record, dict(defaults), UUID(bytes=unkeyed[i])))
            rows.append(i)
        except Exception as exc:  # a bad row is refused with its reason
            rejected.append((i, reason(exc)))
    tasks = import_columns(
        [t.id.bytes for t in good],
        [t.queue for t in good],
        [t.tenant for t in good],
        [t.name for t in good],
        [t.payload for t in good],
        [t.cost for t in good],
        [t.max_attempts for t in good],
        [t.eta for t in good],
        [t.priority for t in good],
        now,
    )
    return CheckedBatch(tasks, rows, rejected)


def _check_columns(
    batch: pa.RecordBatch,
    defaults: Mapping[str, Any],
    unkeyed: Sequence[bytes],
    now: datetime,
    reason: Callable[[BaseException], str],
) -> CheckedBatch:
    n = batch.num_rows
    columns = dict(zip(batch.schema.names, batch.columns, strict=True))
    ok = np.ones(n, dtype=bool)

    names, names_ok = _names(columns.get("name"), n, check_task_name)
    tenants, tenants_ok = _names(columns.get("tenant"), n, check_tenant)
    queues, queues_ok = _queues(columns.get("queue"), n, defaults)
    ok &= names_ok & tenants_ok & queues_ok
    keys, keyed, keys_ok = _keys(columns.get("idempotency_key"), n)
    ok &= keys_ok
    costs, costs_ok = _floats(columns.get("cost"), n, 1.0, MAX_COST)
    attempts, attempts_ok = _integers(
        columns.get("max_attempts"), n, defaults["max_attempts"], check_max_attempts
    )
    priorities, priorities_ok = _integers(columns.get("priority"), n, 0, check_priority)
    ok &= costs_ok & attempts_ok & priorities_ok
    etas, etas_ok, eta_text = _etas(columns, n)
    ok &= etas_ok
    payloads, payload_fast = _compact_payloads(
        columns.get("args"), columns.get("kwargs"), n, defaults["max_payload_bytes"]
    )

    # Row by row, the few the columns could not settle: etas as text, and
    # arguments not in compact form, each as validate_row reads them.
    rowwise = np.flatnonzero(ok & (eta_text | ~payload_fast))
    if len(rowwise):
        args_of = _python_values(columns.get("args"), rowwise)
        kwargs_of = _python_values(columns.get("kwargs"), rowwise)
        text_of = _python_values(columns.get("eta"), rowwise)
        for j, i in enumerate(rowwise.tolist()):
            try:
                if eta_text[i]:
                    eta = datetime.fromisoformat(text_of[j])
                    if not (eta.tzinfo is not None and eta.utcoffset() is not None):
                        raise ValueError("naive")
                    if not EARLIEST <= eta < LATEST:
                        raise ValueError("out of range")
                    etas[i] = eta
                if not payload_fast[i]:
                    args = json_value(args_of[j], [])
                    payloads[i] = dump_payload(
                        list(args) if isinstance(args, list | tuple) else args,
                        json_value(kwargs_of[j], {}),
                        defaults["max_payload_bytes"],
                    )
            except Exception:  # validate_row says why, below
                ok[i] = False

    ids: list[bytes] = [
        task_id_for_key(key, tenant).bytes if is_keyed else unkeyed_id
        for key, tenant, is_keyed, unkeyed_id in zip(keys, tenants, keyed, unkeyed, strict=True)
    ]

    rejected: list[tuple[int, str]] = []
    settled: dict[int, TaskEnvelope] = {}
    unsure = np.flatnonzero(~ok)
    if len(unsure):
        for i, record in zip(unsure.tolist(), records(batch, unsure), strict=True):
            try:
                settled[i] = validate_row(record, dict(defaults), UUID(bytes=unkeyed[i]))
            except Exception as exc:  # a bad row is refused with its reason
                rejected.append((i, reason(exc)))
        for i, envelope in settled.items():
            ids[i], queues[i], tenants[i] = envelope.id.bytes, envelope.queue, envelope.tenant
            names[i], payloads[i], costs[i] = envelope.name, envelope.payload, envelope.cost
            attempts[i], etas[i] = envelope.max_attempts, envelope.eta
            priorities[i] = envelope.priority
        ok[list(settled)] = True
    keep = np.flatnonzero(ok)
    if len(keep) < n:
        rows = keep.tolist()
        pick = _picker(rows)
        tasks = import_columns(
            pick(ids),
            pick(queues),
            pick(tenants),
            pick(names),
            pick(payloads),
            pick(costs),
            pick(attempts),
            pick(etas),
            pick(priorities),
            now,
        )
    else:
        rows = list(range(n))
        tasks = import_columns(
            ids, queues, tenants, names, payloads, costs, attempts, etas, priorities, now
        )
    return CheckedBatch(tasks, rows, rejected)


def records(batch: pa.RecordBatch, rows: np.ndarray) -> list[dict[str, Any]]:
    """Rows of the batch as dicts, as Spark's rows read (maps as dicts), an
    eta in microseconds as the instant it is."""
    taken = batch.take(pa.array(rows, pa.int64()))
    found: list[dict[str, Any]] = taken.to_pylist(maps_as_pydicts="lossy")
    for record in found:
        if ETA_MICROS in record:
            micros = record.pop(ETA_MICROS)
            if micros is not None:
                try:
                    record["eta"] = _EPOCH + timedelta(microseconds=micros)
                except OverflowError:  # past any datetime: refused as the number it is
                    record["eta"] = micros
    return found


def _picker(rows: list[int]) -> Callable[[list[Any]], list[Any]]:
    def pick(values: list[Any]) -> list[Any]:
        return [values[i] for i in rows]

    return pick


def _is_text(column: Any) -> bool:
    return bool(pa.types.is_string(column.type) or pa.types.is_large_string(column.type))


def _passes(check: Callable[[Any], Any], value: Any) -> bool:
    try:
        check(value)
    except Exception:
        return False
    return True


def _names(
    column: Any, n: int, check: Callable[[Any], Any], null_ok: bool = False
) -> tuple[list[Any], np.ndarray]:
    """A text column's values, and which pass `check` (each distinct value
    checked once; a null passes if `null_ok`)."""
    if column is None or not _is_text(column):
        return [None] * n, np.zeros(n, dtype=bool)
    encoded = pc.dictionary_encode(column)
    distinct = encoded.dictionary.to_pylist()
    valid = np.array([_passes(check, value) for value in distinct] + [null_ok])
    indices = pc.fill_null(encoded.indices, len(distinct)).to_numpy()
    values = [*distinct, None]
    return [values[i] for i in indices.tolist()], valid[indices]


def _queues(column: Any, n: int, defaults: Mapping[str, Any]) -> tuple[list[Any], np.ndarray]:
    """Each row's queue (absent or empty: the default), and which are allowed."""
    allowed = defaults["allowed_queues"]

    def check(value: Any) -> Any:
        queue = value or defaults["queue"]
        if allowed is not None and queue not in allowed:
            raise ValueError(queue)
        return check_queue(queue)

    if column is None or column.null_count == n:
        good = _passes(check, None)
        return [defaults["queue"]] * n, np.full(n, good)
    queues, valid = _names(column, n, check, _passes(check, None))
    return [q or defaults["queue"] for q in queues], valid


def _keys(column: Any, n: int) -> tuple[list[Any], list[bool], np.ndarray]:
    """Each row's idempotency key, whether it has one (absent or empty: it
    has none), and which are settled here."""
    if column is None or column.null_count == n:
        return [None] * n, [False] * n, np.ones(n, dtype=bool)
    if not _is_text(column):
        # Any other type's values (falsy ones aside) are refused: row by row.
        return [None] * n, [False] * n, pc.is_null(column).to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.utf8_length(column), 0).to_numpy(zero_copy_only=False)
    keys = column.to_pylist()
    return keys, (lengths > 0).tolist(), lengths <= IDEMPOTENCY_KEY_MAX


def _numbers(column: Any, text_pattern: str) -> tuple[Any, np.ndarray] | None:
    """A column's values as an Arrow array of numbers, and which rows are
    null; None for a type the columns do not settle (decided row by row)."""
    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return column, pc.is_null(column).to_numpy(zero_copy_only=False)
    if _is_text(column):
        nulls = pc.is_null(column).to_numpy(zero_copy_only=False)
        plain = pc.fill_null(pc.match_substring_regex(column, text_pattern), False)
        return pc.if_else(plain, column, pa.scalar(None, column.type)), nulls
    return None


def _floats(column: Any, n: int, default: float, high: float) -> tuple[list[Any], np.ndarray]:
    """Each row's cost (absent: `default`), and which lie in (0, high]."""
    if column is None or column.null_count == n:
        return [default] * n, np.ones(n, dtype=bool)
    numbers = _numbers(column, _DECIMAL_TEXT)
    if numbers is None:  # the nulls take the default, the rest go row by row
        return [default] * n, pc.is_null(column).to_numpy(zero_copy_only=False)
    values, nulls = numbers
    floats = pc.cast(values, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        good = np.where(nulls, True, (floats > 0) & (floats <= high))
    floats = np.where(nulls, default, floats)
    # A bool is not a number: pyarrow has no bool among the integer types.
    return floats.tolist(), good & ~np.isnan(floats)


def _integers(
    column: Any, n: int, default: Any, check: Callable[[Any], Any]
) -> tuple[list[Any], np.ndarray]:
    """Each row's integer (absent: `default`), and which `check` passes (a
    range, checked over the column)."""
    low, high = _RANGES[check]
    default_ok = _passes(check, default)
    if column is None or column.null_count == n:
        return [default] * n, np.full(n, default_ok)
    numbers = _numbers(column, _INTEGER_TEXT)
    if numbers is None or pa.types.is_floating(column.type):
        # Floats are refused (not integers): row by row, as any other type.
        return [default] * n, pc.is_null(column).to_numpy(zero_copy_only=False) & default_ok
    values, nulls = numbers
    if pa.types.is_uint64(column.type):  # past int64's range: out of bounds anyway
        over = pc.greater(values, pa.scalar(high, pa.uint64()))
        values = pc.if_else(over, pa.scalar(high + 1, pa.uint64()), values)
    values = pc.cast(values, pa.int64())
    inside = pc.and_(pc.greater_equal(values, low), pc.less_equal(values, high))
    inside_np = pc.fill_null(inside, False).to_numpy(zero_copy_only=False)
    in_range = pc.if_else(inside, values, 0)
    ints = pc.cast(pc.fill_null(in_range, 0), pa.int64()).to_numpy(zero_copy_only=False)
    good = np.where(nulls, default_ok, inside_np)
    return np.where(nulls, default, ints).tolist(), good


def _etas(columns: Mapping[str, Any], n: int) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """Each row's eta (None: none), which are settled here, and which are
    text to be read row by row."""
    text = np.zeros(n, dtype=bool)
    micros = columns.get(ETA_MICROS)
    column = columns.get("eta")
    if micros is None and column is not None and pa.types.is_timestamp(column.type):
        micros = pc.cast(pc.cast(column, pa.timestamp("us", "UTC")), pa.int64())
    if micros is not None:
        nulls = pc.is_null(micros).to_numpy(zero_copy_only=False)
        values = pc.fill_null(micros, 0).to_numpy(zero_copy_only=False)
        good = nulls | ((values >= _EARLIEST_US) & (values < _LATEST_US))
        # Only times in range become datetimes (any int64 is not one).
        inside = pc.if_else(pa.array(good), micros, pa.scalar(None, pa.int64()))
        return pc.cast(inside, pa.timestamp("us", "UTC")).to_pylist(), good, text
    if column is None or column.null_count == n:
        return [None] * n, np.ones(n, dtype=bool), text
    nulls = pc.is_null(column).to_numpy(zero_copy_only=False)
    if _is_text(column):
        return [None] * n, np.ones(n, dtype=bool), ~nulls
    return [None] * n, nulls, text


def _compact_payloads(args: Any, kwargs: Any, n: int, cap: int) -> tuple[list[Any], np.ndarray]:
    """Each row's payload where its arguments are compact JSON text (or
    absent) and no kwargs (or `{}`) come with them; which rows those are."""
    fast = np.ones(n, dtype=bool)
    if args is None or args.null_count == n:
        args_text: Any = pa.scalar("[]")
    elif _is_text(args):
        compact = pc.fill_null(pc.match_substring_regex(args, _COMPACT_ARRAY), True)
        fast &= compact.to_numpy(zero_copy_only=False)
        args_text = pc.fill_null(args, "[]")
    else:
        return [None] * n, np.zeros(n, dtype=bool)
    if kwargs is not None and kwargs.null_count < n:
        if not _is_text(kwargs):
            return [None] * n, np.zeros(n, dtype=bool)
        empty = pc.fill_null(pc.equal(kwargs, "{}"), True)
        fast &= empty.to_numpy(zero_copy_only=False)
    joined = pc.binary_join_element_wise(
        pa.scalar('{"args":'), args_text, pa.scalar(',"kwargs":{}}'), pa.scalar("")
    )
    if isinstance(joined, pa.Scalar):
        payload = joined.as_py()
        fast &= len(payload.encode()) <= cap
        return [payload] * n, fast
    fast &= pc.binary_length(joined).to_numpy(zero_copy_only=False) <= cap
    return joined.to_pylist(), fast


def _python_values(column: Any, rows: np.ndarray) -> list[Any]:
    if column is None:
        return [None] * len(rows)
    taken = column.take(pa.array(rows, pa.int64()))
    values: list[Any] = taken.to_pylist(maps_as_pydicts="lossy")
    return values
