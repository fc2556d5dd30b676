"""The Redis buffer's format, shared by the producer (writes) and the loader (reads).

The buffer is N Redis streams, `{prefix}:{<shard>}`. A tenant always maps to
the same shard, so its tasks keep their order. The braces are a Redis Cluster
hash tag: each shard lives in one slot and no operation spans two shards,
while different shards spread over the cluster's nodes.

An entry holds a batch of task envelopes of one shard (`enqueue_many` packs up
to ENTRY_MAX_TASKS per entry, which is what makes the buffer fast):

    XADD rota:buffer:{3} * v 1 tasks '[{...envelope...}, ...]'
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import orjson
import redis

from rota.envelope import TaskEnvelope, parse_envelope, parse_envelopes
from rota.errors import ValidationError

ENTRY_VERSION = b"1"
ENTRY_MAX_TASKS = 256


def stream_name(prefix: str, shard: int) -> str:
    return f"{prefix}:{{{shard}}}"


def all_streams(prefix: str, shards: int) -> list[str]:
    return [stream_name(prefix, shard) for shard in range(shards)]


def dead_letter_stream(prefix: str) -> str:
    return f"{prefix}:dead"


@functools.lru_cache(maxsize=65536)
def shard_for(tenant: str, shards: int) -> int:
    """Stable across processes and versions (crc32, not Python's salted hash)."""
    return zlib.crc32(tenant.encode()) % shards


def encode_entries(
    envelopes: Iterable[TaskEnvelope], prefix: str, shards: int
) -> dict[str, list[dict[bytes, bytes]]]:
    """Groups envelopes by shard into stream entries, keeping each tenant's order."""
    by_stream: dict[str, list[TaskEnvelope]] = {}
    for envelope in envelopes:
        stream = stream_name(prefix, shard_for(envelope.tenant, shards))
        by_stream.setdefault(stream, []).append(envelope)
    return {
        stream: [
            {b"v": ENTRY_VERSION, b"tasks": orjson.dumps(tasks[i : i + ENTRY_MAX_TASKS])}
            for i in range(0, len(tasks), ENTRY_MAX_TASKS)
        ]
        for stream, tasks in by_stream.items()
    }


@dataclass(frozen=True)
class Rejected:
    """A buffer entry, or one task of it, that cannot be loaded, and why."""

    raw: bytes
    reason: str


def decode_entry(
    fields: Mapping[bytes, bytes], max_payload_bytes: int
) -> tuple[list[TaskEnvelope], list[Rejected]]:
    """Parses one entry: the valid envelopes, and each invalid part with its reason."""
    version = fields.get(b"v")
    raw = fields.get(b"tasks")
    if version != ENTRY_VERSION or raw is None:
        as_text = {
            k.decode(errors="replace"): v.decode(errors="replace") for k, v in fields.items()
        }
        reason = f"unknown entry format (v={version!r}, has tasks: {raw is not None})"
        return [], [Rejected(orjson.dumps(as_text), reason)]
    envelopes = parse_envelopes(raw, max_payload_bytes)
    if envelopes is not None:
        return envelopes, []
    # Something in it is invalid: one task at a time, to tell which and why.
    try:
        items = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return [], [Rejected(raw, f"entry is not JSON: {exc}")]
    if not isinstance(items, list):
        return [], [Rejected(raw, "entry's tasks are not a JSON list")]
    good: list[TaskEnvelope] = []
    bad: list[Rejected] = []
    for item in items:
        try:
            if not isinstance(item, dict):
                raise ValidationError(f"a task envelope must be a JSON object, not {item!r:.40}")
            good.append(parse_envelope(item, max_payload_bytes))
        except ValidationError as exc:
            bad.append(Rejected(orjson.dumps(item), str(exc)))
    return good, bad


def add_dead_letters(
    pipe: redis.client.Pipeline, prefix: str, dead: Iterable[tuple[str, str, Rejected]]
) -> None:
    """Queues on `pipe` one dead-letter entry per (stream, entry id, rejected):
    the raw data, the reason, and where it came from."""
    for stream, entry_id, rejected in dead:
        fields = {
            b"raw": rejected.raw,
            b"reason": rejected.reason.encode(),
            b"stream": stream.encode(),
            b"entry": entry_id.encode(),
        }
        pipe.xadd(dead_letter_stream(prefix), fields)  # type: ignore[arg-type]
