"""The task envelope's rules: names, payloads, fields."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime
from uuid import UUID

import pytest

from rota.buffer.entries import TaskBatch
from rota.errors import InvalidName, NotJSONSerializable, PayloadTooLarge, ValidationError
from rota.model.envelope import (
    envelope_template,
    make_envelope,
    parse_envelope,
    task_id_for_key,
)


def _ok(**change: object) -> dict[str, object]:
    return {"name": "app.tasks.parse_pdf", "queue": "pdfs", "tenant": "alice", **change}


def test_a_valid_task_round_trips_through_the_buffer_format() -> None:
    envelope = make_envelope(**_ok(args=[1, "two"], kwargs={"x": [3.5]}), cost=2)  # type: ignore[arg-type]
    parsed = parse_envelope(envelope.to_json(), 1024)
    assert parsed == envelope
    assert parsed.payload == '{"args":[1,"two"],"kwargs":{"x":[3.5]}}'


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"queue": "Pdfs"}, InvalidName),
        ({"queue": ""}, InvalidName),
        ({"queue": "q" * 64}, InvalidName),
        ({"tenant": "alice bob"}, InvalidName),
        ({"tenant": "_x"}, InvalidName),
        ({"tenant": 42}, InvalidName),
        ({"name": "1abc"}, InvalidName),
        ({"name": "a..b"}, InvalidName),
        ({"name": "x" * 201}, InvalidName),
        ({"args": [object()]}, NotJSONSerializable),
        ({"args": [datetime.now(UTC)]}, NotJSONSerializable),
        ({"args": [math.nan]}, NotJSONSerializable),
        ({"args": [math.inf]}, NotJSONSerializable),
        ({"kwargs": {1: "non-string key"}}, NotJSONSerializable),
        ({"args": "not a list"}, NotJSONSerializable),
        ({"args": ["x" * 2000]}, PayloadTooLarge),
        ({"cost": 0}, ValidationError),
        ({"cost": -1}, ValidationError),
        ({"cost": math.inf}, ValidationError),
        ({"cost": math.nan}, ValidationError),
        ({"cost": 1e7}, ValidationError),
        ({"max_attempts": 0}, ValidationError),
        ({"max_attempts": 2**31}, ValidationError),
        ({"max_attempts": True}, ValidationError),
        ({"backoff_base": -1}, ValidationError),
        ({"backoff_base": math.nan}, ValidationError),
        ({"backoff_max": math.inf}, ValidationError),
        ({"eta": datetime(2030, 1, 1)}, ValidationError),
    ],
)
def test_bad_tasks_get_typed_errors(change: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        make_envelope(**{**_ok(), "max_payload_bytes": 1024, **change})  # type: ignore[arg-type]


def test_templates_are_checked_once_and_shared_by_equal_options() -> None:
    first = envelope_template("app.tasks.parse_pdf", "pdfs", 3, 1.0, 60.0)
    assert envelope_template("app.tasks.parse_pdf", "pdfs", 3, 1.0, 60.0) is first
    batch = TaskBatch(datetime.now(UTC))
    batch.add(first, "alice", ["a.pdf"], {"pages": 2})
    batch.add(envelope_template("app.tasks.parse_pdf", "pdfs", 3, 1.0, 60.0), "bob")
    assert batch.templates == [first] and batch.template == [0, 0]
    envelope = batch.envelopes()[0]
    assert (envelope.name, envelope.queue, envelope.max_attempts) == (
        "app.tasks.parse_pdf",
        "pdfs",
        3,
    )
    assert parse_envelope(envelope.to_json(), 1024) == envelope
    with pytest.raises(InvalidName):
        envelope_template("app.tasks.parse_pdf", ["not", "a", "name"], 3)  # type: ignore[arg-type]


def test_null_arguments_are_fine() -> None:
    envelope = make_envelope(**_ok(args=[None], kwargs={"x": None}))  # type: ignore[arg-type]
    assert envelope.payload == '{"args":[null],"kwargs":{"x":null}}'


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"not json", "malformed"),
        (b'{"v": 1}', "id"),
        (b'{"v": 2, "id": "00000000-0000-0000-0000-000000000000"}', "v"),
    ],
)
def test_malformed_buffer_entries_say_what_is_wrong(raw: bytes, says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        parse_envelope(raw, 1024)


def test_a_buffer_entry_with_a_bad_payload_is_refused() -> None:
    envelope = make_envelope(**_ok())  # type: ignore[arg-type]
    broken = dataclasses.replace(envelope, payload="[1, 2]").to_json()
    with pytest.raises(ValidationError, match="args"):
        parse_envelope(broken, 1024)
    huge = dataclasses.replace(
        envelope, payload='{"args": ["' + "x" * 2000 + '"], "kwargs": {}}'
    ).to_json()
    with pytest.raises(PayloadTooLarge):
        parse_envelope(huge, 1024)


def test_task_ids_sort_by_creation_and_keys_name_one_task() -> None:
    ids = [make_envelope(**_ok()).id for _ in range(100)]  # type: ignore[arg-type]
    assert ids == sorted(ids)
    assert len(set(ids)) == 100
    # Plain stdlib UUIDs, version 7, that survive a round trip through text.
    assert all(type(i) is UUID and i.version == 7 and UUID(str(i)) == i for i in ids)
    assert task_id_for_key("k1", "alice") == task_id_for_key("k1", "alice")
    assert task_id_for_key("k1", "alice") != task_id_for_key("k1", "bob")


def test_fast_ids_are_stdlib_uuids_in_every_way() -> None:
    """new_task_id sets UUID's slots itself: the result must be
    indistinguishable from UUID(int=...), on this Python and the next."""
    import copy
    import pickle
    import uuid

    from rota.model.envelope import new_task_id, uuid_of_int

    minted = new_task_id()
    for value in (minted.int, 0, 2**128 - 1, uuid.uuid4().int):
        fast, slow = uuid_of_int(value), uuid.UUID(int=value)
        assert type(fast) is uuid.UUID
        assert fast == slow and hash(fast) == hash(slow) and str(fast) == str(slow)
        assert fast.bytes == slow.bytes and fast.is_safe == slow.is_safe
        assert pickle.loads(pickle.dumps(fast)) == slow and copy.copy(fast) == slow
    assert minted.version == 7
