"""Buffer entries: a batch's columns, decoded in one pass, or task by task when invalid."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from rota.buffer.entries import TaskBatch
from rota.buffer.streams import (
    ENTRY_MAX_TASKS,
    ENTRY_VERSION,
    SPREAD_FIELD,
    decode_entry,
    encode_entries,
    shard_for,
)
from rota.model.envelope import envelope_template

CAP = 1024
WORK = envelope_template("app.work", "q", 3, 1.0, 60.0)
OTHER = envelope_template("app.other", "r", 5, 2.0, 10.0)


def _batch(count: int, tenant: str = "alice") -> TaskBatch:
    batch = TaskBatch(datetime.now(UTC))
    for i in range(count):
        batch.add(OTHER if i % 3 == 1 else WORK, tenant, [i])
    return batch


def _entry(columns: dict[str, Any]) -> dict[bytes, bytes]:
    return {b"v": ENTRY_VERSION, b"tasks": orjson.dumps(columns)}


def test_a_valid_entry_decodes_to_every_task_in_order() -> None:
    batch = _batch(600)
    ((entries),) = encode_entries(batch, "rota:buffer", 1).values()
    assert len(entries) == -(-600 // ENTRY_MAX_TASKS)
    decoded = [e for fields in entries for e in decode_entry(fields, CAP)[0].envelopes()]
    assert decoded == batch.envelopes()
    # Templates are written once per entry, not once per task.
    assert orjson.loads(entries[0][b"tasks"])["templates"] == [
        ["app.work", "q", 3, 1.0, 60.0],
        ["app.other", "r", 5, 2.0, 10.0],
    ]


def test_tenants_keep_their_order_within_their_shard() -> None:
    batch = TaskBatch(datetime.now(UTC))
    tenants = [f"t{i % 7}" for i in range(100)]
    for i, tenant in enumerate(tenants):
        batch.add(WORK, tenant, [i])
    by_stream = encode_entries(batch, "rota:buffer", 4)
    for stream, entries in by_stream.items():
        for fields in entries:
            tasks = decode_entry(fields, CAP)[0].envelopes()
            assert all(stream.endswith(f"{{{shard_for(e.tenant, 4)}}}") for e in tasks)
            for tenant in set(tenants):
                args = [orjson.loads(e.payload)["args"][0] for e in tasks if e.tenant == tenant]
                assert args == sorted(args)
    assert sum(len(decode_entry(f, CAP)[0]) for es in by_stream.values() for f in es) == 100


def test_each_entry_of_a_write_over_several_shards_says_how_many() -> None:
    one = encode_entries(_batch(3), "rota:buffer", 4)
    assert [SPREAD_FIELD in f for es in one.values() for f in es] == [False]
    batch = TaskBatch(datetime.now(UTC))
    for i in range(40):
        batch.add(WORK, f"t{i}", [i])
    spread = encode_entries(batch, "rota:buffer", 4)
    assert len(spread) == 4
    assert {f[SPREAD_FIELD] for es in spread.values() for f in es} == {b"4"}


def test_a_checked_batch_survives_its_json() -> None:
    batch = _batch(5)
    batch.add(WORK, "bob", [], {"k": None}, cost=2.5, eta=datetime(2030, 1, 1, tzinfo=UTC))
    again = TaskBatch.from_checked_json(batch.to_json())
    assert again.envelopes() == batch.envelopes()
    assert set(again.ids) == set(batch.ids)  # the rebuilt ids hash as the originals


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("tenant", "no spaces", "tenant"),
        ("payload", "not json", "payload is not JSON"),
        ("payload", '{"args": []}', "exactly 'args' and 'kwargs'"),
        ("payload", '{"args": ["' + "x" * CAP + '"], "kwargs": {}}', "over the cap"),
        ("cost", -1, "cost"),
        ("eta", "2026-01-01T00:00:00", "eta: Input should have timezone"),
        ("id", "not-a-uuid", "id"),
        ("template", 7, "no valid template"),
        ("template", "0", "no valid template"),
    ],
)
def test_one_bad_task_is_rejected_with_its_reason_and_the_others_kept(
    column: str, value: object, says: str
) -> None:
    batch = _batch(5)
    columns = orjson.loads(batch.to_json())
    columns[column][2] = value
    good, rejected = decode_entry(_entry(columns), CAP)
    assert good.envelopes() == batch.select([0, 1, 3, 4]).envelopes()
    assert len(rejected) == 1
    assert says in rejected[0].reason
    # The dead letter holds the whole task, readable without its entry.
    task = orjson.loads(rejected[0].raw)
    assert task[column] == value
    if column != "template":
        assert (task["name"], task["queue"]) == ("app.work", "q")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"templates": [["app.work", "BAD QUEUE", 3, 1.0, 60.0], ["app.other", "r", 5, 2, 10]]},
            "queue",
        ),
        (
            {"templates": [["app.work", "q", 2**40, 1.0, 60.0], ["app.other", "r", 5, 2, 10]]},
            "max_attempts",
        ),
        ({"enqueued_at": "2026-01-01T00:00:00"}, "enqueued_at: Input should have timezone"),
    ],
)
def test_a_bad_template_or_time_rejects_the_tasks_that_use_it(
    change: dict[str, object], says: str
) -> None:
    batch = _batch(5)
    columns = orjson.loads(batch.to_json()) | change
    good, rejected = decode_entry(_entry(columns), CAP)
    # Tasks 1 and 4 use the second template; the time is every task's.
    uses_bad = [0, 2, 3] if "templates" in change else [0, 1, 2, 3, 4]
    assert len(rejected) == len(uses_bad)
    assert all(says in r.reason for r in rejected)
    kept = [i for i in range(5) if i not in uses_bad]
    assert good.envelopes() == (batch.select(kept).envelopes() if kept else [])


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "keys"),
        (b'{"enqueued_at": 1}', "keys"),
    ],
)
def test_a_malformed_entry_is_rejected_whole(raw: bytes, says: str) -> None:
    good, rejected = decode_entry({b"v": ENTRY_VERSION, b"tasks": raw}, CAP)
    assert not good
    assert len(rejected) == 1 and says in rejected[0].reason and rejected[0].raw == raw


def test_columns_of_different_lengths_reject_the_entry() -> None:
    columns = orjson.loads(_batch(3).to_json())
    columns["cost"].pop()
    good, rejected = decode_entry(_entry(columns), CAP)
    assert not good and "differ in length" in rejected[0].reason


def test_an_unknown_entry_version_is_rejected() -> None:
    good, rejected = decode_entry({b"v": b"1", b"tasks": b"[]"}, CAP)
    assert not good and "unknown entry format" in rejected[0].reason


def test_a_bad_task_is_refused_before_anything_is_added() -> None:
    batch = _batch(2)
    with pytest.raises(Exception, match="tenant"):
        batch.add(WORK, "no spaces", [1])
    with pytest.raises(Exception, match="cost"):
        batch.add(WORK, "alice", [1], cost=0)
    assert len(batch) == 2 and all(len(c) == 2 for c in (batch.payloads, batch.template))


def test_the_stream_clock_reads_an_entry_ids_time() -> None:
    from rota.buffer.streams import entry_seconds, oldest_age

    assert entry_seconds("1700000000123-7") == 1700000000.123
    assert entry_seconds(b"1700000000123-0") == 1700000000.123
    assert entry_seconds("1700000000123") == 1700000000.123
    ids = ["1700000005000-0", b"1700000001000-3", "1700000003000-1"]
    assert oldest_age(ids, now=1700000011.0) == 10.0
    assert oldest_age([], now=1.0) == 0.0
    assert oldest_age(["1700000005000-0"], now=1700000000.0) == 0.0  # a clock behind Redis


def test_priorities_travel_in_the_entry_only_when_a_task_has_one() -> None:
    plain = _batch(3)
    assert "priority" not in orjson.loads(plain.to_json())  # as every entry before priorities
    urgent = _batch(3)
    urgent.add(WORK, "bob", [9], priority=9)
    columns = orjson.loads(urgent.to_json())
    assert columns["priority"] == [0, 0, 0, 9]
    good, rejected = decode_entry(_entry(columns), CAP)
    assert not rejected and [e.priority for e in good.envelopes()] == [0, 0, 0, 9]
    assert TaskBatch.from_checked_json(urgent.to_json()).envelopes() == urgent.envelopes()
    assert good.select([3, 0]).priorities == [9, 0]


def test_an_entry_written_before_priorities_loads_every_task_at_0() -> None:
    columns = orjson.loads(_batch(4).to_json())
    assert set(columns) == {
        "enqueued_at",
        "templates",
        "template",
        "id",
        "tenant",
        "payload",
        "cost",
        "eta",
    }
    good, rejected = decode_entry(_entry(columns), CAP)
    assert not rejected and [e.priority for e in good.envelopes()] == [0, 0, 0, 0]
    assert TaskBatch.from_checked_json(orjson.dumps(columns)).priorities == [0, 0, 0, 0]


@pytest.mark.parametrize("value", [10, -1, 2.0, "3", True])
def test_a_task_with_a_bad_priority_is_rejected_and_the_others_kept(value: object) -> None:
    batch = _batch(3)
    batch.add(WORK, "bob", [9], priority=4)
    columns = orjson.loads(batch.to_json())
    columns["priority"][1] = value
    good, rejected = decode_entry(_entry(columns), CAP)
    assert [e.priority for e in good.envelopes()] == [0, 0, 4]
    assert len(rejected) == 1 and "priority" in rejected[0].reason
    columns["priority"].pop()
    good, rejected = decode_entry(_entry(columns), CAP)
    assert not good and "differ in length" in rejected[0].reason
