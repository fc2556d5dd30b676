"""The producers: carry out `ProducerCore`'s effects with redis-py and
psycopg, sync (`Producer`) or asyncio (`AsyncProducer`). What each effect
means is written once, here; the two classes differ only in awaiting."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Generator
from typing import Any, TypeVar
from uuid import UUID

import psycopg

from rota import core
from rota.buffer import redis_client
from rota.buffer.entries import TaskBatch
from rota.buffer.redis_client import NotReplicated
from rota.core import connections, db, versions
from rota.core.db import Op
from rota.core.effects import adrive, drive
from rota.producer.core import (
    REDIS_ERRORS,
    WRITE_BACKOFF,
    AwaitRefresh,
    Effect,
    FetchBacklogs,
    LoadDatabase,
    ProbeBuffer,
    ProducerCore,
    ReadBufferBacklogs,
    RefreshInBackground,
    WriteBuffer,
)
from rota.runtime import tracing
from rota.runtime.outage import AsyncKept, Kept, with_async_retries, with_retries
from rota.settings import Settings

T = TypeVar("T")

RedisEffect = WriteBuffer | ProbeBuffer | ReadBufferBacklogs
NodeOf = Callable[[str], Any] | None


def queue_commands(pipe: Any, effect: RedisEffect, node_of: NodeOf = None) -> None:
    """Queues a Redis effect's commands on a pipeline (read back by `result_of`).
    `node_of` names a cluster's node for a key (None for a single Redis)."""
    if isinstance(effect, WriteBuffer):
        # The XADDs, then one XLEN per stream, then the backlog counts, then
        # the WAITs: one per node written to, on the connection that wrote.
        for stream, entries in effect.entries.items():
            for fields in entries:
                pipe.xadd(stream, fields)
        if effect.measure:
            for stream in effect.entries:
                pipe.xlen(stream)
        for key, costs in effect.backlog.items():
            for tenant, cost in costs.items():
                pipe.hincrbyfloat(key, tenant, cost)
        if effect.replicas:
            timeout_ms = max(1, int(effect.wait_seconds * 1000))
            for node in _nodes(effect, node_of):
                options = {} if node is None else {"target_nodes": node}
                pipe.execute_command("WAIT", effect.replicas, timeout_ms, **options)
    elif isinstance(effect, ProbeBuffer):
        for stream in effect.streams:
            pipe.xlen(stream)
    else:
        for key in effect.keys:
            pipe.hgetall(key)


def _nodes(effect: WriteBuffer, node_of: NodeOf) -> list[Any]:
    if node_of is None:
        return [None]
    nodes = {}
    for key in (*effect.entries, *effect.backlog):
        node = node_of(key)
        nodes[node.name] = node
    return list(nodes.values())


def result_of(effect: RedisEffect, replies: list[Any]) -> Any:
    """What the flow receives for a Redis effect, from its pipeline's replies."""
    if isinstance(effect, WriteBuffer):
        if effect.replicas:
            written = sum(len(entries) for entries in effect.entries.values())
            written += len(effect.entries) * effect.measure
            written += sum(len(costs) for costs in effect.backlog.values())
            confirmed = [int(n) for n in replies[written:]]
            if min(confirmed) < effect.replicas:
                raise NotReplicated(
                    f"{min(confirmed)} of {effect.replicas} replica(s) confirmed the write "
                    f"within {effect.wait_seconds:g} s (ROTA_REDIS_WAIT_REPLICAS)"
                )
        if not effect.measure:
            return {}
        start = sum(len(entries) for entries in effect.entries.values())
        lengths = replies[start : start + len(effect.entries)]
        return {stream: int(n) for stream, n in zip(effect.entries, lengths, strict=True)}
    if isinstance(effect, ProbeBuffer):
        return dict(zip(effect.streams, map(int, replies), strict=True))
    total: dict[str, float] = {}
    for counts in replies:
        for tenant, cost in counts.items():
            name = tenant.decode() if isinstance(tenant, bytes) else tenant
            total[name] = total.get(name, 0.0) + float(cost)
    return total


def database_step(effect: LoadDatabase) -> tuple[Op[Any], bool]:
    """A load's operation, and whether it runs in a transaction of its own:
    it does, except in the caller's open transaction (`connection=`), where
    it commits or rolls back with the caller's work."""
    own = effect.connection is None or effect.connection.autocommit
    return core.load(effect.envelopes), own


class Producer:
    """Sync producer. Thread-safe; one per process is enough."""

    def __init__(self, settings: Settings, core: ProducerCore | None = None) -> None:
        self.core = core or ProducerCore(settings)
        self.settings = settings
        self._redis: redis_client.Client | None = None
        self._conn = Kept(self._connect)
        self._conn_lock = threading.Lock()
        # The capacity refreshes' own connection, used by one refresh thread
        # at a time (ProducerCore: one refresh under way), never by an
        # enqueue: a stalled PostgreSQL holds it, not `_conn_lock`.
        self._refresh_pid = -1
        self._refresh_conn: Kept[psycopg.Connection[Any]]
        self._refresh_thread: threading.Thread | None
        self._refresh_lock: threading.Lock  # the thread's start and end, and close()
        self._refreshes()
        self._closed = False
        # A Redis effect: a plain call, tried again only once it failed.
        self._send_retried = with_retries(
            self._send, REDIS_ERRORS, self.core.retries, WRITE_BACKOFF
        )

    @property
    def redis(self) -> redis_client.Client:
        if self._redis is None:
            # Retries are ours (`with_retries`, then the fallback), not redis-py's.
            self._redis = redis_client.connect(self.settings, retries=0)
        return self._redis

    def store(self, batch: TaskBatch, connection: Any = None) -> list[UUID]:
        with tracing.enqueue(batch, self.core.settings.max_payload_bytes):
            return drive(self.core.store(batch, connection), self._carry_out)

    def transact(self, op: Op[T], connection: psycopg.Connection[Any] | None = None) -> T:
        """Runs `op` straight in PostgreSQL, as a load with `connection=`
        does: in the caller's open transaction (it commits or rolls back with
        the caller's work), else in a transaction of its own (on `connection`
        in autocommit, or on the producer's)."""
        if connection is not None:
            if connection.autocommit:
                return db.transact(connection, op)
            return db.run(connection, op)
        with self._conn_lock:
            try:
                return db.transact(self._connection(), op)
            except db.SERVER_LOST:
                self._drop_connection()
                raise

    def _carry_out(self, effect: Effect) -> Any:
        if isinstance(effect, RedisEffect):
            return self._send_retried(effect)
        if isinstance(effect, RefreshInBackground):
            return self._start_refresh(effect)
        if isinstance(effect, AwaitRefresh):
            return effect.done.wait(effect.seconds)
        if isinstance(effect, FetchBacklogs):
            raise TypeError("FetchBacklogs runs in a refresh's thread, not on the request path")
        op, own_transaction = database_step(effect)
        run = db.transact if own_transaction else db.run
        if effect.connection is not None:
            return run(effect.connection, op)
        with self._conn_lock:
            try:
                return run(self._connection(), op)
            except db.SERVER_LOST:
                self._drop_connection()
                raise

    def _refreshes(self) -> None:
        """The refreshes' connection, thread and lock, made anew in a forked
        child: the parent's thread is not there, a lock it held at the fork
        would stay held, and its connection is the parent's (closing it here
        would end the parent's session: it is forgotten)."""
        if self._refresh_pid != os.getpid():
            self._refresh_conn = Kept(self._connect)
            self._refresh_thread = None
            self._refresh_lock = threading.Lock()
            self._refresh_pid = os.getpid()

    def _start_refresh(self, effect: RefreshInBackground) -> None:
        self._refreshes()
        thread = threading.Thread(
            target=self._refresh, args=(effect,), name="rota-capacity-refresh", daemon=True
        )
        with self._refresh_lock:
            self._refresh_thread = thread
            try:
                thread.start()
            except BaseException:
                self._refresh_thread = None
                raise

    def _refresh(self, effect: RefreshInBackground) -> None:
        """A refresh's thread: its effects carried out, its database read on
        the refreshes' own connection."""
        try:
            drive(effect.flow, self._carry_out_refresh)
        finally:
            effect.flow.close()
            effect.ended()
            with self._refresh_lock:
                self._refresh_thread = None
                if self._closed:
                    self._refresh_conn.drop()

    def _carry_out_refresh(self, effect: Effect) -> Any:
        if not isinstance(effect, FetchBacklogs):
            return self._carry_out(effect)
        try:
            return db.run(self._refresh_conn.get(), core.tenant_backlogs())
        except db.SERVER_LOST:
            self._refresh_conn.drop()
            raise

    def _send(self, effect: RedisEffect) -> Any:
        client = self.redis
        pipe = client.pipeline(transaction=False)
        queue_commands(pipe, effect, redis_client.node_finder(client))
        return result_of(effect, pipe.execute())

    def _connect(self) -> psycopg.Connection[Any]:
        """A connection of the producer's, once the database's schema is one
        this rota runs on (rota.core.versions)."""
        return versions.ready(connections.connect(self.settings, "enqueue"))

    def _connection(self) -> psycopg.Connection[Any]:
        return self._conn.get()

    def _drop_connection(self) -> None:
        self._conn.drop()

    def close(self) -> None:
        """Closes the producer's connections; a refresh under way (PostgreSQL
        stalled, say) is not waited for: its thread closes its connection
        when it ends."""
        if self._redis is not None:
            self._redis.close()
        self._refreshes()
        with self._refresh_lock:
            self._closed = True
            if self._refresh_thread is None:
                self._refresh_conn.drop()
        with self._conn_lock:
            self._drop_connection()


class AsyncProducer:
    """asyncio producer (FastAPI, Starlette): the same flow, awaited."""

    def __init__(self, settings: Settings, core: ProducerCore | None = None) -> None:
        self.core = core or ProducerCore(settings)
        self.settings = settings
        self._redis: redis_client.AsyncClient | None = None
        self._conn = AsyncKept(self._aconnect)
        self._conn_lock = asyncio.Lock()
        # The capacity refreshes' own connection and task (`Producer`'s).
        self._refresh_conn = AsyncKept(self._aconnect)
        self._refresh_task: asyncio.Task[None] | None = None
        self._closed = False
        self._send_retried = with_async_retries(
            self._send, REDIS_ERRORS, self.core.retries, WRITE_BACKOFF
        )

    async def _aconnect(self) -> psycopg.AsyncConnection[Any]:
        """The database fallback's connection, once the database's schema is
        one this rota runs on (rota.core.versions)."""
        return await versions.aready(await connections.aconnect(self.settings, "enqueue"))

    async def redis(self) -> redis_client.AsyncClient:
        if self._redis is None:
            self._redis = await redis_client.aconnect(self.settings, retries=0)
        return self._redis

    async def store(self, batch: TaskBatch, connection: Any = None) -> list[UUID]:
        with tracing.enqueue(batch, self.core.settings.max_payload_bytes):
            return await adrive(self.core.store(batch, connection), self._carry_out)

    async def transact(
        self, op: Op[T], connection: psycopg.AsyncConnection[Any] | None = None
    ) -> T:
        """`Producer.transact`, awaited."""
        if connection is not None:
            if connection.autocommit:
                return await db.atransact(connection, op)
            return await db.arun(connection, op)
        async with self._conn_lock:
            try:
                return await db.atransact(await self._connection(), op)
            except db.SERVER_LOST:
                await self._drop_connection()
                raise

    async def _carry_out(self, effect: Effect) -> Any:
        if isinstance(effect, RedisEffect):
            return await self._send_retried(effect)
        if isinstance(effect, RefreshInBackground):
            task = asyncio.get_running_loop().create_task(
                self._refresh(effect.flow), name="rota-capacity-refresh"
            )
            task.add_done_callback(lambda _: effect.ended())
            self._refresh_task = task
            return None
        if isinstance(effect, AwaitRefresh):
            return await self._await_refresh(effect)
        if isinstance(effect, FetchBacklogs):
            raise TypeError("FetchBacklogs runs in a refresh's task, not on the request path")
        op, own_transaction = database_step(effect)
        run = db.atransact if own_transaction else db.arun
        if effect.connection is not None:
            return await run(effect.connection, op)
        async with self._conn_lock:
            try:
                return await run(await self._connection(), op)
            except db.SERVER_LOST:
                await self._drop_connection()
                raise

    async def _await_refresh(self, effect: AwaitRefresh) -> None:
        task = self._refresh_task
        if effect.done.is_set():
            return
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            await asyncio.wait({task}, timeout=effect.seconds)
        else:  # the sync producer's thread (a shared ProducerCore)
            await asyncio.to_thread(effect.done.wait, effect.seconds)

    async def _refresh(self, flow: Generator[Effect, Any, None]) -> None:
        """A refresh's task: `Producer._refresh`, awaited."""
        try:
            await adrive(flow, self._carry_out_refresh)
        finally:
            flow.close()
            if self._refresh_task is asyncio.current_task():
                self._refresh_task = None
            if self._closed:
                await self._refresh_conn.drop()

    async def _carry_out_refresh(self, effect: Effect) -> Any:
        if not isinstance(effect, FetchBacklogs):
            return await self._carry_out(effect)
        try:
            return await db.arun(await self._refresh_conn.get(), core.tenant_backlogs())
        except db.SERVER_LOST:
            await self._refresh_conn.drop()
            raise

    async def _send(self, effect: RedisEffect) -> Any:
        aclient = await self.redis()
        pipe = aclient.pipeline(transaction=False)
        queue_commands(pipe, effect, redis_client.node_finder(aclient))
        return result_of(effect, await pipe.execute())

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        return await self._conn.get()

    async def _drop_connection(self) -> None:
        await self._conn.drop()

    async def close(self) -> None:
        """`Producer.close`: a refresh under way is cancelled, not waited for
        (its task closes its connection as it ends)."""
        if self._redis is not None:
            await self._redis.aclose()
        self._closed = True
        task = self._refresh_task
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
        else:
            await self._refresh_conn.drop()
        async with self._conn_lock:
            await self._drop_connection()
