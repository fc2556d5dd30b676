"""Settling the buffer after a load, written once for both engines: dead
letters recorded first, then the loaded entries taken off their shards (the
Python engine acknowledges and deletes them; the Spark engine, which keeps
offsets, trims each shard through its last one), then the capacity-limited
tenants' backlog counts lowered, and, now and then, the dead-letter stream
kept to its retention."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence

import redis

from rota.buffer.redis_client import Client
from rota.buffer.streams import (
    Rejected,
    add_dead_letters,
    next_entry_id,
    read_backlog_tenants,
    subtract_backlogs,
    trim_dead_letters,
)
from rota.settings import Settings

log = logging.getLogger("rota.loader")

Dead = tuple[str, str, Rejected]


class DeadLettersRefused(redis.RedisError):
    """Redis refused a dead letter: what it rejected cannot leave the buffer yet."""


# (stream, entry id, what was rejected and why)


class BufferSettle:
    def __init__(self, client: Callable[[], Client], settings: Settings) -> None:
        self._client = client  # called each time: an engine may reconnect in between
        self.settings = settings
        self._retention_trimmed_at = float("-inf")

    def record_dead(self, dead: Sequence[Dead]) -> set[tuple[str, str]]:
        """Writes each dead letter; returns the (stream, entry id) of those
        Redis refused (logged), whose entries must then stay in the buffer."""
        if not dead:
            return set()
        pipe = self._client().pipeline(transaction=False)
        add_dead_letters(pipe, self.settings.stream_prefix, dead)
        unrecorded: set[tuple[str, str]] = set()
        for (stream, entry_id, rejected), reply in zip(
            dead, pipe.execute(raise_on_error=False), strict=True
        ):
            if isinstance(reply, Exception):
                unrecorded.add((stream, entry_id))
                log.error(
                    "could not dead-letter %s %s (%s), left in the buffer: %s",
                    stream,
                    entry_id,
                    reply,
                    rejected.reason,
                )
            else:
                log.warning("dead-lettered %s %s: %s", stream, entry_id, rejected.reason)
        return unrecorded

    def finish(
        self,
        loaded: Iterable[tuple[str, Iterable[tuple[str, float]]]],
        *,
        acknowledge: dict[str, list[str]] | None = None,
        trim_through: dict[str, str] | None = None,
    ) -> None:
        """Takes settled entries off the shards: `acknowledge` (stream: entry
        ids, for a consumer group's loader) or `trim_through` (stream: last
        entry id, for an offset-keeping one). `loaded` (stream, each task's
        tenant and cost) is subtracted from the backlog counts."""
        client = self._client()
        loaded = list(loaded)
        pipe = client.pipeline(transaction=False)
        for stream, ids in (acknowledge or {}).items():
            pipe.xack(stream, self.settings.loader_group, *ids)
            pipe.xdel(stream, *ids)
        for stream, entry_id in (trim_through or {}).items():
            pipe.xtrim(stream, minid=next_entry_id(entry_id), approximate=False)
        # In the same round trip: the limited tenants counted on those shards
        # (usually none, and then nothing more is sent).
        streams = read_backlog_tenants(pipe, loaded)
        replies = pipe.execute()
        subtract_backlogs(client, loaded, streams, replies[len(replies) - len(streams) :])
        if time.monotonic() - self._retention_trimmed_at >= self.settings.retention_seconds:
            self._retention_trimmed_at = time.monotonic()
            trim_dead_letters(
                client, self.settings.stream_prefix, self.settings.dead_letter_retention
            )
