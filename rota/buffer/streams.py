"""The Redis buffer's format, shared by the producer (writes) and the loader (reads).

The buffer is N Redis streams, `{prefix}:{<shard>}`. A tenant always maps to
the same shard, so its tasks keep their order. The braces are a Redis Cluster
hash tag: each shard lives in one slot and no operation spans two shards,
while different shards spread over the cluster's nodes.

An entry holds a batch of tasks of one shard, column by column (up to
ENTRY_MAX_TASKS; `enqueue_many` packs them, which is what makes the buffer
fast), with each distinct name, queue and retry policy written once:

    XADD rota:buffer:{3} * v 2 tasks '{"enqueued_at": ..., "templates":
        [["app.parse_pdf", "pdfs", 3, 1.0, 3600.0]], "template": [0, 0],
        "id": [...], "tenant": [...], "payload": [...], "cost": [...], "eta": [...]}'
"""

from __future__ import annotations

import functools
import time
import zlib
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from rota.buffer.entries import TaskBatch, parse_batch
from rota.buffer.redis_client import Client
from rota.errors import ValidationError

ENTRY_VERSION = b"2"
ENTRY_MAX_TASKS = 256
# Set on each entry of a write that spans several shards: how many. A loader
# woken by one of them reads the others at once (BufferReader.read_new).
SPREAD_FIELD = b"spread"


def stream_name(prefix: str, shard: int) -> str:
    return f"{prefix}:{{{shard}}}"


def all_streams(prefix: str, shards: int) -> list[str]:
    return [stream_name(prefix, shard) for shard in range(shards)]


def dead_letter_stream(prefix: str) -> str:
    return f"{prefix}:dead"


def trim_dead_letters(client: Client, prefix: str, retention_seconds: float) -> int:
    """Drops dead letters older than the retention (stream ids are times)."""
    oldest_kept_ms = int((time.time() - retention_seconds) * 1000)
    return int(client.xtrim(dead_letter_stream(prefix), minid=f"{oldest_kept_ms}-0"))


def backlog_key(stream: str) -> str:
    """A hash of {tenant: cost units} that a shard holds for tenants with a
    capacity: producers add as they write, loaders subtract as they load. It
    shares the stream's hash tag, so it lives in the same Cluster slot."""
    return f"{stream}:backlog"


def tenant_costs(batch: TaskBatch, tenants: Container[str]) -> dict[str, float]:
    """The cost units `batch` holds for each of `tenants` it names."""
    costs: dict[str, float] = {}
    for tenant, cost in zip(batch.tenants, batch.costs, strict=True):
        if tenant in tenants:
            costs[tenant] = costs.get(tenant, 0.0) + cost
    return costs


# Subtracts loaded work from a shard's backlog hash (KEYS[1]); ARGV holds
# tenant, cost pairs. Only tenants already counted are touched, and a count
# that reaches zero is removed, so the hash stays as small as the set of
# capacity-limited tenants with work in the buffer.
SUBTRACT_BACKLOG = """
for i = 1, #ARGV, 2 do
    if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
        local left = tonumber(redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], -tonumber(ARGV[i + 1])))
        if left <= 1e-9 then redis.call('HDEL', KEYS[1], ARGV[i]) end
    end
end
return 0
"""

# Clears a shard's backlog hash (KEYS[2]) once its stream (KEYS[1]) is empty:
# counts that drifted (a producer or loader killed between its write and its
# count) start again from zero.
RESET_BACKLOG_IF_EMPTY = """
if redis.call('XLEN', KEYS[1]) == 0 then return redis.call('DEL', KEYS[2]) end
return 0
"""


@functools.lru_cache(maxsize=65536)
def shard_for(tenant: str, shards: int) -> int:
    """Stable across processes and versions (crc32, not Python's salted hash)."""
    return zlib.crc32(tenant.encode()) % shards


def encode_entries(
    batch: TaskBatch, prefix: str, shards: int
) -> dict[str, list[dict[bytes, bytes]]]:
    """Splits a batch by shard into stream entries, keeping each tenant's order."""
    by_stream: dict[str, list[int]] = {}
    stream_of: dict[str, list[int]] = {}  # per tenant: its stream's list (a batch has few)
    for index, tenant in enumerate(batch.tenants):
        indices = stream_of.get(tenant)
        if indices is None:
            stream = stream_name(prefix, shard_for(tenant, shards))
            indices = stream_of[tenant] = by_stream.setdefault(stream, [])
        indices.append(index)
    if len(by_stream) == 1 and len(batch) <= ENTRY_MAX_TASKS:  # a single enqueue, say
        return {stream: [{b"v": ENTRY_VERSION, b"tasks": batch.to_json()}] for stream in by_stream}
    spread = {SPREAD_FIELD: b"%d" % len(by_stream)} if len(by_stream) > 1 else {}
    return {
        stream: [
            {
                b"v": ENTRY_VERSION,
                b"tasks": batch.select(indices[i : i + ENTRY_MAX_TASKS]).to_json(),
                **spread,
            }
            for i in range(0, len(indices), ENTRY_MAX_TASKS)
        ]
        for stream, indices in by_stream.items()
    }


@dataclass(frozen=True)
class Rejected:
    """A buffer entry, or one task of it, that cannot be loaded, and why."""

    raw: bytes
    reason: str


def decode_entry(
    fields: Mapping[bytes, bytes],
    max_payload_bytes: int,
    allowed_queues: frozenset[str] | None = None,
) -> tuple[TaskBatch, list[Rejected]]:
    """Parses one entry: the valid tasks, and each invalid part with its reason
    (a task of a queue outside `allowed_queues`, when given, among them)."""
    version = fields.get(b"v")
    raw = fields.get(b"tasks")
    if version != ENTRY_VERSION or raw is None:
        as_text = {
            k.decode(errors="replace"): v.decode(errors="replace") for k, v in fields.items()
        }
        reason = f"unknown entry format (v={version!r}, has tasks: {raw is not None})"
        return TaskBatch.empty(), [Rejected(orjson.dumps(as_text), reason)]
    try:
        batch, bad = parse_batch(raw, max_payload_bytes)
    except ValidationError as exc:
        return TaskBatch.empty(), [Rejected(raw, str(exc))]
    rejected = [Rejected(task, reason) for task, reason in bad]
    if allowed_queues is not None and any(t.queue not in allowed_queues for t in batch.templates):
        keep = []
        for index, envelope in enumerate(batch.envelopes()):
            if envelope.queue in allowed_queues:
                keep.append(index)
            else:
                reason = f"queue {envelope.queue!r} is not in ROTA_QUEUES"
                rejected.append(Rejected(envelope.to_json(), reason))
        batch = batch.select(keep)
    return batch, rejected


def add_dead_letters(pipe: Any, prefix: str, dead: Iterable[tuple[str, str, Rejected]]) -> None:
    """Queues on `pipe` one dead-letter entry per (stream, entry id, rejected):
    the raw data, the reason, and where it came from."""
    for stream, entry_id, rejected in dead:
        fields = {
            b"raw": rejected.raw,
            b"reason": rejected.reason.encode(),
            b"stream": stream.encode(),
            b"entry": entry_id.encode(),
        }
        pipe.xadd(dead_letter_stream(prefix), fields)


def read_backlog_tenants(pipe: Any, loaded: Sequence[tuple[str, Iterable[Any]]]) -> list[str]:
    """Queues on `pipe` the reads of the loaded shards' backlog hashes' keys
    (the capacity-limited tenants counted there); returns the shards, in the
    order of the replies, for subtract_backlogs."""
    streams = sorted({stream for stream, _ in loaded})
    for stream in streams:
        pipe.hkeys(backlog_key(stream))
    return streams


def subtract_backlogs(
    client: Client,
    loaded: Sequence[tuple[str, Iterable[tuple[str, float]]]],
    streams: Sequence[str],
    tenant_keys: Sequence[Any],
) -> None:
    """Takes loaded work (stream, each task's tenant and cost) of
    capacity-limited tenants off the shards' backlog hashes, which the
    producer's capacity check reads; `streams` and `tenant_keys` are what
    read_backlog_tenants queued and the replies it got."""
    counted = {
        stream: {t.decode() if isinstance(t, bytes) else t for t in tenants}
        for stream, tenants in zip(streams, tenant_keys, strict=True)
        if tenants
    }
    if not counted:
        return  # the usual case: no limited tenant has work in the buffer
    costs: dict[str, dict[str, float]] = {}
    for stream, tasks in loaded:
        tenants = counted.get(stream)
        if tenants:
            per_tenant = costs.setdefault(stream, {})
            for tenant, cost in tasks:
                if tenant in tenants:
                    per_tenant[tenant] = per_tenant.get(tenant, 0.0) + cost
    pipe = client.pipeline(transaction=False)
    for stream, per_tenant in costs.items():
        if per_tenant:
            args = [x for pair in per_tenant.items() for x in pair]
            # EVAL, not EVALSHA: a cluster pipeline cannot load a script a
            # node lacks, and the body is a few hundred bytes. (Its `eval`
            # method is refused; the command itself is not.)
            pipe.execute_command("EVAL", SUBTRACT_BACKLOG, 1, backlog_key(stream), *args)
    pipe.execute()


def buffer_stats(client: Any, streams: list[str], group: str) -> dict[str, dict[str, float | int]]:
    """Per shard: entries waiting (read or not), entries read but not yet
    loaded, and the age of the oldest entry not yet loaded."""
    pipe = client.pipeline(transaction=False)
    for stream in streams:
        pipe.xlen(stream)
        pipe.xpending(stream, group)
        pipe.xrange(stream, count=1)
    # Before any loader ran there is no consumer group: nothing is pending.
    replies: list[Any] = pipe.execute(raise_on_error=False)
    now = time.time()
    stats: dict[str, dict[str, float | int]] = {}
    for i, stream in enumerate(streams):
        length, pending, first = replies[3 * i : 3 * i + 3]
        for reply in (length, first):
            if isinstance(reply, Exception):
                raise reply
        if isinstance(pending, redis.ResponseError) and "NOGROUP" in str(pending):
            pending = {"pending": 0}
        elif isinstance(pending, Exception):
            raise pending
        stats[stream] = {
            "entries": int(length),
            "pending": int(pending["pending"]),
            "oldest_age_seconds": round(oldest_age([e[0] for e in first[:1]], now), 3),
        }
    return stats


def check_entry_id(entry_id: str) -> str:
    """A stream entry id as an operator gives one (`<ms>-<seq>` or `<ms>`),
    or a ValidationError: Redis would refuse anything else with an error."""
    ms, dash, seq = entry_id.partition("-")
    if (
        not (ms.isascii() and ms.isdigit() and (not dash or (seq.isascii() and seq.isdigit())))
        or max(int(ms), int(seq or 0)) >= 2**64
    ):
        raise ValidationError(f"{entry_id[:40]!r} is not a stream entry id (<ms>-<seq>)")
    return entry_id


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id, `<ms>-<seq>`, as a sortable pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def next_entry_id(entry_id: str) -> str:
    """The smallest stream id greater than `entry_id` (for XTRIM MINID)."""
    ms, seq = entry_key(entry_id)
    return f"{ms}-{seq + 1}"


def entry_seconds(entry_id: bytes | str) -> float:
    """The stream's clock: the time (seconds since the epoch) in an entry's
    id, `<ms>-<seq>`; Redis stamps it when the entry is added."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0]) / 1000


def oldest_age(entry_ids: Iterable[bytes | str], now: float | None = None) -> float:
    """How long (seconds, never negative) the oldest of these entries has
    waited; 0.0 for none."""
    oldest = min((entry_seconds(i) for i in entry_ids), default=None)
    if oldest is None:
        return 0.0
    return max(0.0, (time.time() if now is None else now) - oldest)
