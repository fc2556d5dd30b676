"""Decoding buffer entries: a valid entry in one pass, an invalid one task by task."""

from __future__ import annotations

import orjson
import pytest

from rota.buffer import ENTRY_VERSION, decode_entry, encode_entries
from rota.envelope import make_envelope

CAP = 1024


def _tasks(count: int) -> list[dict[str, object]]:
    envelopes = [
        make_envelope(name="app.work", queue="q", tenant="alice", args=[i]) for i in range(count)
    ]
    return orjson.loads(orjson.dumps(envelopes))  # type: ignore[no-any-return]


def _entry(items: list[object]) -> dict[bytes, bytes]:
    return {b"v": ENTRY_VERSION, b"tasks": orjson.dumps(items)}


def test_a_valid_entry_decodes_to_every_task_in_order() -> None:
    envelopes = [
        make_envelope(name="app.work", queue="q", tenant="alice", args=[i]) for i in range(300)
    ]
    ((entries),) = encode_entries(envelopes, "rota:buffer", 1).values()
    decoded = [e for fields in entries for e in decode_entry(fields, CAP)[0]]
    assert decoded == envelopes


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"tenant": "no spaces"}, "tenant"),
        ({"payload": "not json"}, "payload is not JSON"),
        ({"payload": '{"args": []}'}, "exactly 'args' and 'kwargs'"),
        ({"payload": '{"args": ["' + "x" * CAP + '"], "kwargs": {}}'}, "over the cap"),
        ({"cost": -1}, "cost"),
        # Naive times and attempts beyond the integer column would fail the COPY.
        ({"enqueued_at": "2026-01-01T00:00:00"}, "enqueued_at: Input should have timezone"),
        ({"eta": "2026-01-01T00:00:00"}, "eta: Input should have timezone"),
        ({"max_attempts": 2**40}, "max_attempts"),
    ],
)
def test_one_bad_task_is_rejected_with_its_reason_and_the_others_kept(
    bad: dict[str, object], says: str
) -> None:
    items: list[object] = _tasks(5)
    items[2] = {**items[2], **bad}  # type: ignore[dict-item]
    good, rejected = decode_entry(_entry(items), CAP)
    assert [e.payload for e in good] == [items[i]["payload"] for i in (0, 1, 3, 4)]  # type: ignore[index]
    assert len(rejected) == 1
    assert says in rejected[0].reason
    assert orjson.loads(rejected[0].raw) == items[2]


def test_an_item_that_is_not_an_object_is_rejected() -> None:
    items: list[object] = [*_tasks(2), 42]
    good, rejected = decode_entry(_entry(items), CAP)
    assert len(good) == 2
    assert "JSON object" in rejected[0].reason
