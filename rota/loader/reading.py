"""Reading the buffer for a Python loader: new entries (XREADGROUP), entries
a dead loader left pending (XAUTOCLAIM), and entries kept across an outage."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import redis

from rota.buffer import redis_client
from rota.buffer.streams import SPREAD_FIELD
from rota.settings import Settings

Entry = tuple[str, str, dict[bytes, bytes]]  # (stream, entry id, fields)

# Until the first entries are seen, a loader assumes packed ones: a first pass
# that reads too little costs one round trip; one that reads too much leaves
# the other loaders idle.
FIRST_GUESS_TASKS_PER_ENTRY = 64.0
# Entries become reclaimable only once idle for ROTA_LOADER_IDLE_RECLAIM_SECONDS:
# looking more often than a fraction of that finds nothing, and costs a round
# trip per shard on every pass (most of a pass when the buffer is quiet).
RECLAIM_LOOKS_PER_IDLE = 4
RECLAIM_LOOK_MAX_SECONDS = 5.0
# On a cluster no XREADGROUP spans two shards (each is its own slot), so a
# loader cannot block on all of them at once: it reads each without blocking
# and, finding nothing, looks again after a pause that doubles up to the
# maximum, so that an idle loader costs a few commands a second per shard
# while a busy one waits at most a millisecond or two.
CLUSTER_POLL_FIRST_SECONDS = 0.001
CLUSTER_POLL_MAX_SECONDS = 0.05


class BufferReader:
    def __init__(
        self, client: redis_client.Client, settings: Settings, consumer: str, streams: list[str]
    ) -> None:
        self.redis = client
        self.cluster = redis_client.is_cluster_client(client)
        self.settings = settings
        self.consumer = consumer
        self.streams = streams
        # Tasks per entry seen last: sizes the next read.
        self.tasks_per_entry = FIRST_GUESS_TASKS_PER_ENTRY
        self._next_reclaim = 0.0  # the first pass looks at once

    def reclaim(self) -> tuple[list[Entry], list[Entry]]:
        """Entries idle in another (dead) loader's hands: (to load, delivered
        too often); looked for a few times per idle period, not every pass."""
        now = time.monotonic()
        if now < self._next_reclaim:
            return [], []
        idle = self.settings.loader_idle_reclaim_seconds
        self._next_reclaim = now + min(idle / RECLAIM_LOOKS_PER_IDLE, RECLAIM_LOOK_MAX_SECONDS)
        idle_ms = int(idle * 1000)
        usable: list[Entry] = []
        exhausted: list[Entry] = []
        for stream in self.streams:
            # redis-py's response types are loose; these shapes are Redis 7's.
            reply: Any = self.redis.xautoclaim(
                stream,
                self.settings.loader_group,
                self.consumer,
                idle_ms,
                "0-0",
                count=self.settings.loader_read_count,
            )
            claimed = reply[1]
            if not claimed:
                continue
            ids = [entry_id for entry_id, _ in claimed]
            pending: Any = self.redis.xpending_range(
                stream,
                self.settings.loader_group,
                min=ids[0],
                max=ids[-1],
                count=len(ids),
                consumername=self.consumer,
            )
            deliveries = {p["message_id"]: p["times_delivered"] for p in pending}
            for entry_id, fields in claimed:
                entry = (stream, _text(entry_id), fields)
                if deliveries.get(entry_id, 1) > self.settings.loader_max_deliveries:
                    exhausted.append(entry)
                else:
                    usable.append(entry)
        return usable, exhausted

    def keep_pending(self, entries: list[Entry], idle_ms: int | None = None) -> None:
        """Resets the entries' idle time (to `idle_ms`, else to 0) without
        counting a delivery (JUSTID)."""
        by_stream: dict[str, list[Any]] = {}
        for stream, entry_id, _ in entries:
            by_stream.setdefault(stream, []).append(entry_id)
        for stream, ids in by_stream.items():
            self.redis.xclaim(
                stream,
                self.settings.loader_group,
                self.consumer,
                0,
                ids,
                idle=idle_ms,
                justid=True,
            )

    def release(self, entries: list[Entry]) -> None:
        """Entries this loader read but will not load: made idle for as long
        as a reclaim waits (ROTA_LOADER_IDLE_RECLAIM_SECONDS), so that the
        next loader's first pass takes them, without a delivery counted."""
        self.keep_pending(entries, int(self.settings.loader_idle_reclaim_seconds * 1000) + 1)

    def pending_elsewhere(self) -> int:
        """Entries read by other loaders and not yet loaded (XPENDING)."""
        pipe = self.redis.pipeline(transaction=False)
        for stream in self.streams:
            pipe.xpending(stream, self.settings.loader_group)
        mine = 0
        total = 0
        for reply in pipe.execute():
            total += int(reply["pending"])
            for consumer in reply.get("consumers") or []:
                if _text(consumer["name"]) == self.consumer:
                    mine += int(consumer["pending"])
        return total - mine

    def read_count(self) -> int:
        """Entries to read per shard: about one batch of tasks in all, whether
        entries carry one task (single enqueues) or hundreds (enqueue_many), so
        that several loaders share a backlog instead of one taking it all."""
        per_pass = 2 * self.settings.loader_batch_size / (self.tasks_per_entry * len(self.streams))
        return max(1, min(self.settings.loader_read_count, int(per_pass)))

    def read_new(self, block_ms: int | None) -> list[Entry]:
        """New entries of every shard, waiting up to `block_ms` for some."""
        if self.cluster:
            return self._read_each_shard(block_ms)
        count = self.read_count()
        entries = self._read(self.streams, count, block_ms)
        if block_ms is not None and entries:
            # A blocked XREADGROUP is answered with the one stream that woke
            # it: the rest of a write spread over several shards is read now
            # rather than a whole pass later.
            seen = {stream for stream, _, _ in entries}
            if _spread(entries) > len(seen):
                # If it fails, the entries in hand are this pass's: what the
                # failed read delivered is reclaimed, like any entry a pass dropped.
                with contextlib.suppress(redis.RedisError):
                    entries += self._read([s for s in self.streams if s not in seen], count)
        return entries

    def _read(self, streams: list[str], count: int, block_ms: int | None = None) -> list[Entry]:
        response: Any = self.redis.xreadgroup(
            self.settings.loader_group,
            self.consumer,
            dict.fromkeys(streams, ">"),
            count=count,
            block=block_ms,
        )
        return _entries(response)

    def _read_each_shard(self, block_ms: int | None) -> list[Entry]:
        deadline = time.monotonic() + (block_ms or 0) / 1000
        pause = CLUSTER_POLL_FIRST_SECONDS
        count = self.read_count()
        while True:
            pipe = self.redis.pipeline(transaction=False)
            for stream in self.streams:
                # The node is named: redis-py would otherwise ask the server
                # where XREADGROUP's keys are (COMMAND GETKEYS) every time.
                pipe.execute_command(
                    "XREADGROUP",
                    "GROUP",
                    self.settings.loader_group,
                    self.consumer,
                    "COUNT",
                    count,
                    "STREAMS",
                    stream,
                    ">",
                    target_nodes=redis_client.node_of(self.redis, stream),
                )
            entries = [e for reply in pipe.execute() for e in _entries(reply)]
            left = deadline - time.monotonic()
            if entries or left <= 0:
                return entries
            time.sleep(min(pause, left))
            pause = min(2 * pause, CLUSTER_POLL_MAX_SECONDS)


def _entries(response: Any) -> list[Entry]:
    """XREADGROUP's reply, [[stream, [(id, fields), ...]], ...], as entries."""
    entries: list[Entry] = []
    for stream, items in response or []:
        entries.extend((_text(stream), _text(entry_id), fields) for entry_id, fields in items)
    return entries


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _spread(entries: list[Entry]) -> int:
    """The most shards that any of these entries' writes went to (a field
    that is not a number counts as one: the entry is judged when decoded)."""
    most = 1
    for _, _, fields in entries:
        value = fields.get(SPREAD_FIELD)
        if value is not None and value.isdigit():
            most = max(most, int(value))
    return most
