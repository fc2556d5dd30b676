"""The Python loader: the Redis buffer into PostgreSQL, in bulk, exactly once.

One pass (`Loader.pass_once`):
  1. reclaim entries another loader left pending too long (XAUTOCLAIM), and
     read new ones (XREADGROUP over every shard);
  2. decode and validate them; what is malformed, or was delivered too many
     times, goes to the dead-letter stream with its reason;
  3. load the tasks with the core's bulk SQL (COPY + one call), COMMIT;
  4. only then XACK and XDEL the entries.
A crash before 3 leaves the entries pending (reclaimed later); a crash between
3 and 4 loads them again, and the producer-minted ids make that a no-op.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import redis

from rota import core
from rota.buffer import redis_client
from rota.buffer.entries import TaskBatch
from rota.buffer.streams import (
    RESET_BACKLOG_IF_EMPTY,
    Rejected,
    all_streams,
    backlog_key,
    buffer_stats,
    decode_entry,
    oldest_age,
)
from rota.core import connections, db, versions
from rota.loader.acks import Acknowledger
from rota.loader.reading import BufferReader, Entry
from rota.loader.settle import BufferSettle
from rota.loader.store import load_entries
from rota.readmodel.metrics import LoaderMetrics
from rota.runtime.outage import Kept, Outage, Polled, one_line, run_rounds, run_until_done
from rota.settings import Settings

log = logging.getLogger("rota.loader")

# A pass fails on these when a server is lost or refuses writes; the loop
# waits the outage out (rota.runtime.outage). Any error of Redis's is one: a
# ResponseError too (out of memory, read-only), unless the group is missing,
# which ensure_groups repairs on the next pass.
LOADER_OUTAGES: tuple[type[Exception], ...] = (
    *db.SERVER_LOST,
    *redis_client.SERVER_LOST,
    redis.RedisError,
)


# A long-running loader's blocking read; a stop is noticed between reads.
BLOCK_MS = 1000
# How often a loader waiting out an outage checks whether it should stop.
STOP_CHECK_SECONDS = 0.1


@dataclass
class PassResult:
    entries: int = 0
    loaded: int = 0  # new tasks stored
    duplicates: int = 0  # tasks already stored (a replayed entry)
    dead_lettered: int = 0
    reclaimed: int = 0


@dataclass
class DrainSummary(PassResult):
    """The sum of a drain's passes."""

    passes: int = 0
    seconds: float = 0.0
    drained: bool = False
    errors: list[str] = field(default_factory=list)
    # Entries other loaders read and have not loaded (yet): work left.
    pending_elsewhere: int = 0
    # Entries this drain read, could not load, and handed back for the next.
    released: int = 0

    def add(self, result: PassResult) -> None:
        self.passes += 1
        for counter in dataclasses.fields(PassResult):
            name = counter.name
            setattr(self, name, getattr(self, name) + getattr(result, name))

    @property
    def exit_code(self) -> int:
        """For cron: 0 drained, 1 failed, 2 stopped by the time limit with work left."""
        if self.errors:
            return 1
        return 0 if self.drained else 2


def default_consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Loader:
    def __init__(
        self,
        settings: Settings,
        consumer: str | None = None,
        client: redis_client.Client | None = None,
        metrics: LoaderMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.last_lag = 0.0  # age of the oldest entry the last pass read
        self.consumer = consumer or default_consumer_name()
        # Outages are the loader's to retry (one policy for every loop).
        self.redis = client or redis_client.connect(
            settings, timeout=settings.loader_redis_timeout_seconds, retries=0
        )
        self.streams = all_streams(settings.stream_prefix, settings.shards)
        # Commits that skip the WAL flush, settled after one; behind a
        # transaction pooler, where a connection's setting would outlive it,
        # each commit waits instead.
        self._flushes_apart = not settings.transaction_pooling
        self._conn = Kept(self._connect)
        # A long-running loader's acknowledgements, off its loop (run_forever).
        self._acks: Acknowledger | None = None
        self._groups_ready = False
        self.reader = BufferReader(self.redis, settings, self.consumer, self.streams)
        self.settle = BufferSettle(lambda: self.redis, settings)
        # (entries, exhausted entries) read by a pass that did not finish.
        self._held: tuple[list[Entry], list[Entry]] | None = None

    # -- plumbing --------------------------------------------------------------

    @property
    def conn(self) -> psycopg.Connection[Any]:
        return self._conn.get()

    def _connect(self) -> psycopg.Connection[Any]:
        """The loading connection: its commits make tasks claimable without
        waiting for the WAL flush; what a pass loaded is acknowledged after a
        flush (rota.loader.acks, or in the pass for a drain), unless behind a
        transaction pooler."""
        conn = versions.ready(connections.connect(self.settings, "load"))
        if self._flushes_apart:
            db.run(conn, core.commit_without_flush())
        return conn

    def close(self) -> None:
        self.release_held()
        self._drop_connection()
        self.redis.close()

    def release_held(self) -> int:
        """Hands back what a pass read but could not load (rota.loader.reading:
        `release`), for the next loader to take at once; returns how many."""
        if self._held is None:
            return 0
        entries, exhausted = self._held
        held = [*entries, *exhausted]
        try:
            self.reader.release(held)
        except redis.RedisError as exc:
            # Redis is what failed: they are reclaimed after the idle time.
            log.warning("could not hand back %d buffer entries: %s", len(held), exc)
            return 0
        self._held = None
        return len(held)

    def _drop_connection(self) -> None:
        self._conn.drop()

    def _after_failure(self, error: BaseException) -> None:
        """The next pass connects anew (the old connection closed, not leaked)
        and checks the consumer groups (a Redis restarted without its data
        has none). Entries in hand are kept for the next pass only when a
        server was lost: an error of theirs (a statement timeout, say) must
        use up their deliveries and end in the dead-letter stream."""
        conn = self._conn.current
        lost = (
            isinstance(error, redis_client.SERVER_LOST)
            or conn is None
            or conn.closed
            or conn.broken
        )
        if not lost:
            self._held = None
        self._drop_connection()
        self._groups_ready = False

    def ensure_groups(self) -> None:
        if self._groups_ready:
            return
        for stream in self.streams:
            try:
                self.redis.xgroup_create(stream, self.settings.loader_group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._groups_ready = True

    # -- one pass --------------------------------------------------------------

    def pass_once(self, block_ms: int | None = None) -> PassResult:
        """Reads what is there (waiting up to `block_ms` for new entries) and loads it."""
        self.ensure_groups()
        # Connected before anything is read: a loader that cannot reach
        # PostgreSQL takes no entry it could not store.
        _ = self.conn
        result = PassResult()
        if self._held is None and self._acks is not None:
            again = self._acks.take_again()
            if again:
                self._held = (again, [])
        if self._held is not None:
            # What a pass read but could not finish (an outage of either
            # server): this loader loads it again. XCLAIM JUSTID resets its
            # idle time without counting a delivery, so that no outage, however
            # long, uses up the entries' deliveries (ROTA_LOADER_MAX_DELIVERIES).
            entries, exhausted = self._held
            self.reader.keep_pending([*entries, *exhausted])
        else:
            reclaimed, exhausted = self.reader.reclaim()
            result.reclaimed = len(reclaimed) + len(exhausted)
            fresh = self.reader.read_new(block_ms if not reclaimed and not exhausted else None)
            entries = reclaimed + fresh
            self._held = (entries, exhausted)
        result.entries = len(entries) + len(exhausted)
        self.last_lag = oldest_age(entry_id for _, entry_id, _ in entries + exhausted)

        dead: list[tuple[Entry, Rejected]] = [
            (
                entry,
                Rejected(
                    entry[2].get(b"tasks", b""),
                    f"delivered more than {self.settings.loader_max_deliveries} times "
                    "without being loaded",
                ),
            )
            for entry in exhausted
        ]
        decoded: list[tuple[Entry, TaskBatch]] = []
        for entry in entries:
            batch, bad = decode_entry(
                entry[2], self.settings.max_payload_bytes, self.settings.allowed_queues
            )
            decoded.append((entry, batch))
            dead.extend((entry, rejected) for rejected in bad)

        tasks = sum(len(batch) for _, batch in decoded)
        if entries:
            self.reader.tasks_per_entry = max(1.0, tasks / len(entries))
        began = time.monotonic()
        stored, refused = load_entries(self.conn, decoded, self.settings.loader_batch_size)
        result.loaded = stored
        result.duplicates = tasks - stored - len(refused)
        dead.extend(refused)
        result.dead_lettered = len(dead)
        # Durable before acknowledged: this pass's commits, and those of a
        # loader that died before acknowledging what is loaded again.
        settle = functools.partial(self._finish, entries + exhausted, dead, decoded)
        if self._acks is not None:
            self._acks.submit(began, settle, entries + exhausted)  # after a flush, off this loop
        else:
            if tasks and self._flushes_apart:
                db.run(self.conn, core.flush_commits())
            settle()
        self._held = None
        if not result.entries:
            self._reset_backlogs()
        return result

    def _finish(
        self,
        entries: list[Entry],
        dead: list[tuple[Entry, Rejected]],
        decoded: list[tuple[Entry, TaskBatch]],
    ) -> None:
        """Dead letters first, checked; only then are entries acknowledged and
        deleted. An entry whose dead letter Redis refused stays pending (it is
        reclaimed and tried again): nothing leaves the buffer unless it is in
        PostgreSQL or in the dead-letter stream."""
        unrecorded = self.settle.record_dead(
            [(stream, entry_id, rejected) for (stream, entry_id, _), rejected in dead]
        )
        done: dict[str, list[str]] = {}
        for stream, entry_id, _ in entries:
            if (stream, entry_id) not in unrecorded:
                done.setdefault(stream, []).append(entry_id)
        self.settle.finish(
            [
                (stream, zip(batch.tenants, batch.costs, strict=True))
                for (stream, entry_id, _), batch in decoded
                if (stream, entry_id) not in unrecorded
            ],
            acknowledge=done,
        )

    def _reset_backlogs(self) -> None:
        """Nothing was read: counts of shards that are empty start from zero again."""
        pipe = self.redis.pipeline(transaction=False)
        for stream in self.streams:
            pipe.execute_command("EVAL", RESET_BACKLOG_IF_EMPTY, 2, stream, backlog_key(stream))
        pipe.execute()

    # -- observability ---------------------------------------------------------

    def buffer_stats(self) -> dict[str, dict[str, float | int]]:
        """Per shard: entries waiting, entries read but not yet loaded, and the
        age of the oldest entry not yet loaded."""
        self.ensure_groups()
        return buffer_stats(self.redis, self.streams, self.settings.loader_group)

    # -- drains ----------------------------------------------------------------

    def drain(
        self,
        max_seconds: float | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        on_pass: Callable[[DrainSummary], None] | None = None,
    ) -> DrainSummary:
        """Passes until the buffer is empty, the time is up or `should_stop()`;
        `on_pass` sees the running sum after each pass (once per batch read,
        never per task)."""
        summary = DrainSummary()
        started = time.monotonic()
        deadline = None if max_seconds is None else started + max_seconds
        outage = Outage("the buffer or PostgreSQL (drain)", log)
        stop = Polled(should_stop, STOP_CHECK_SECONDS)
        while not should_stop():
            if deadline is not None and time.monotonic() >= deadline:
                break
            # Within a time budget an outage is waited out; without one (or
            # past it) the drain fails, for cron to retry.
            result = run_until_done(
                self.pass_once,
                outage,
                LOADER_OUTAGES,
                stop.wait,
                deadline=time.monotonic() if deadline is None else deadline,
                lost=self._after_failure,
            )
            if result is None:
                if outage.last_error is not None and outage.down:
                    summary.errors.append(one_line(outage.last_error))
                summary.released = self.release_held()
                break
            self._passed(result)
            summary.add(result)
            if result.entries == 0:
                # Empty for this loader; entries in other loaders' hands
                # (alive, or dead and not yet reclaimable) are work left.
                summary.pending_elsewhere = self.reader.pending_elsewhere()
                summary.drained = summary.pending_elsewhere == 0
                break
            if on_pass is not None:
                summary.seconds = round(time.monotonic() - started, 3)
                on_pass(summary)
        summary.seconds = round(time.monotonic() - started, 3)
        return summary

    def run_forever(
        self, should_stop: Callable[[], bool], block_ms: int = BLOCK_MS
    ) -> DrainSummary:
        """Long-running: waits on the streams, loads as entries arrive, until
        `should_stop()` (checked between passes, so a batch is never cut short)."""
        summary = DrainSummary()
        started = time.monotonic()
        outage = Outage("the buffer or PostgreSQL (loader)", log)
        log.info(
            "loader %s reading %d shard(s) of %s (group %s)",
            self.consumer,
            len(self.streams),
            self.settings.stream_prefix,
            self.settings.loader_group,
        )

        def one_pass() -> None:
            result = self.pass_once(block_ms=block_ms)
            self._passed(result)
            summary.add(result)

        stop = Polled(should_stop, STOP_CHECK_SECONDS)
        if self._flushes_apart:
            self._acks = Acknowledger(self.settings)
        try:
            run_rounds(one_pass, outage, LOADER_OUTAGES, stop, lost=self._after_failure)
        finally:
            if self._acks is not None:
                self._acks.stop()
                self._acks = None
        summary.seconds = round(time.monotonic() - started, 3)
        return summary

    def _passed(self, result: PassResult) -> None:
        if result.entries:
            log.info(
                "loaded %d task(s) from %d entries (%d already stored, %d dead-lettered, "
                "%d reclaimed); lag %.3f s",
                result.loaded,
                result.entries,
                result.duplicates,
                result.dead_lettered,
                result.reclaimed,
                self.last_lag,
            )
        if self.metrics is not None:
            self.metrics.passed(
                result.loaded, result.duplicates, result.dead_lettered, self.last_lag
            )
