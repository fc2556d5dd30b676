"""Property-based: whatever a task's fields or a raw buffer entry hold, the
result is a checked task or a typed refusal with a reason, never a crash."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rota.buffer.entries import TaskBatch
from rota.buffer.streams import ENTRY_VERSION, decode_entry
from rota.errors import ValidationError
from rota.model.envelope import envelope_template, make_envelope, parse_envelope

CAP = 4096

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
odd_values = st.one_of(
    json_values,
    st.datetimes(timezones=st.just(UTC)),
    st.datetimes(),
    st.dates(),
    st.just(object()),
    st.binary(max_size=5),
)
names = st.one_of(
    st.sampled_from(["app.task", "pdfs", "alice", "acme:eu", "a" * 201, "x\n", "", "Q"]),
    st.text(max_size=30),
    odd_values,
)
numbers = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["5", True, None, 0, 1, 1e300]),
)
ZONES = st.sampled_from([UTC, timezone(timedelta(hours=-14)), timezone(timedelta(hours=14))])
times = st.one_of(
    st.none(),
    st.datetimes(
        min_value=datetime(1, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.sampled_from(
            [UTC, timezone(timedelta(hours=-14)), timezone(timedelta(hours=14))]
        ),
    ),
    st.datetimes(),
    st.text(max_size=30),
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=names,
    queue=names,
    tenant=names,
    args=st.one_of(st.lists(odd_values, max_size=3), odd_values),
    kwargs=st.one_of(st.dictionaries(st.text(max_size=5), odd_values, max_size=3), odd_values),
    cost=numbers,
    max_attempts=numbers,
    backoff=numbers,
    eta=times,
)
def test_any_task_fields_give_a_checked_task_or_a_validation_error(
    name: Any,
    queue: Any,
    tenant: Any,
    args: Any,
    kwargs: Any,
    cost: Any,
    max_attempts: Any,
    backoff: Any,
    eta: Any,
) -> None:
    try:
        envelope = make_envelope(
            name=name,
            queue=queue,
            tenant=tenant,
            args=args,
            kwargs=kwargs,
            cost=cost,
            max_attempts=max_attempts,
            backoff_base=backoff,
            eta=eta,
            max_payload_bytes=CAP,
        )
    except ValidationError:
        return
    # Accepted: the loader's own validation of the same task agrees.
    assert parse_envelope(envelope.to_json(), CAP) == envelope


def _valid_entry(count: int) -> dict[str, Any]:
    batch = TaskBatch(datetime.now(UTC))
    template = envelope_template("app.work", "q", 3, 1.0, 60.0)
    for i in range(count):
        batch.add(template, f"t{i % 3}", [i])
    decoded: dict[str, Any] = orjson.loads(batch.to_json())
    return decoded


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    count=st.integers(min_value=1, max_value=4),
    column=st.sampled_from(
        ["enqueued_at", "templates", "template", "id", "tenant", "payload", "cost", "eta", "extra"]
    ),
    index=st.integers(min_value=0, max_value=3),
    value=st.one_of(
        json_values,
        st.sampled_from(
            [
                "9999-12-31T23:00:00-14:00",
                "2030-01-01T00:00:00",
                "1999-01-01T00:00:00+00:00",
                '{"args": [123456789012345678901234567890], "kwargs": {}}',
                '{"args": ' + "[" * 3000 + "]" * 3000 + ', "kwargs": {}}',
                ["app.work\n", "q", 3, 1.0, 60.0],
                ["app.work", "q", 3, 1e300, 60.0],
                ["app.work", "q", "3", 1.0, 60.0],
                ["app.work", "q", 0, 1.0, 60.0],
            ]
        ),
    ),
    version=st.sampled_from([ENTRY_VERSION, b"1", b"x"]),
)
def test_any_buffer_entry_is_loaded_or_refused_with_a_reason(
    count: int, column: str, index: int, value: Any, version: bytes
) -> None:
    entry = _valid_entry(count)
    if column in entry and isinstance(entry[column], list) and column != "templates":
        entry[column][index % count] = value
    elif column == "templates":
        entry["templates"][0] = value
    else:
        entry[column] = value
    try:
        raw = orjson.dumps(entry)
    except TypeError:
        return  # not JSON at all: nothing a producer could write
    batch, rejected = decode_entry({b"v": version, b"tasks": raw}, CAP)
    assert all(r.reason for r in rejected)
    for envelope in batch.envelopes():
        assert parse_envelope(envelope.to_json(), CAP) == envelope  # loadable as it is
    if version != ENTRY_VERSION:
        assert not batch and len(rejected) == 1
    else:
        # Every task accounted for: loaded, or refused on its own or with its entry.
        assert len(batch) + len(rejected) == count or (not batch and len(rejected) == 1)
