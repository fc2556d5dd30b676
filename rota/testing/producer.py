"""Producers that store in memory: rota's own producer flow (`ProducerCore.store`:
the capacity check, the buffer's entries, the transactional path), with its
effects carried out on a `Line` instead of Redis and PostgreSQL. An entry
"written to the buffer" is read back at once as a loader reads it
(`decode_entry`: the same checks, the same dead letters)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, NoReturn
from uuid import UUID

from rota.buffer.entries import TaskBatch
from rota.buffer.streams import Rejected, decode_entry
from rota.core.effects import adrive, drive
from rota.producer import AsyncProducer, Producer, ProducerCore
from rota.producer.core import (
    AwaitRefresh,
    Effect,
    FetchBacklogs,
    LoadDatabase,
    ProbeBuffer,
    ReadBufferBacklogs,
    RefreshInBackground,
    WriteBuffer,
)
from rota.settings import Settings
from rota.testing.line import Line


class Effects:
    """Carries out a producer's effects on `line`: buffer writes are loaded at
    once (so the buffer is always empty), database loads too, and a refresh
    of the capacities lands before the enqueue goes on (deterministic: no
    thread)."""

    def __init__(
        self,
        settings: Settings,
        line: Line,
        clock: Callable[[], datetime],
        capacities: Mapping[str, int],
    ) -> None:
        self.settings = settings
        self.line = line
        self.clock = clock
        self.capacities = dict(capacities)
        self.dead_letters: list[Rejected] = []  # what a loader would refuse

    def __call__(self, effect: Effect) -> Any:
        if isinstance(effect, WriteBuffer):
            for entries in effect.entries.values():
                for fields in entries:
                    batch, rejected = decode_entry(
                        fields, self.settings.max_payload_bytes, self.settings.allowed_queues
                    )
                    self.line.load(batch.envelopes(), self.clock())
                    self.dead_letters.extend(rejected)
            return dict.fromkeys(effect.entries, 0) if effect.measure else {}
        if isinstance(effect, ProbeBuffer):
            return dict.fromkeys(effect.streams, 0)
        if isinstance(effect, ReadBufferBacklogs):
            return {}
        if isinstance(effect, FetchBacklogs):
            return self.line.backlogs(self.capacities)
        if isinstance(effect, RefreshInBackground):
            try:
                return drive(effect.flow, self)
            finally:
                effect.ended()
        if isinstance(effect, AwaitRefresh):
            return None
        assert isinstance(effect, LoadDatabase)  # `connection=`: as if it commits
        return self.line.load(effect.envelopes, self.clock())


def _no_server() -> NoReturn:
    raise RuntimeError("rota.testing's in-memory producer has no Redis")


class MemoryProducer(Producer):
    def __init__(self, settings: Settings, core: ProducerCore, effects: Effects) -> None:
        super().__init__(settings, core)
        self.effects = effects

    def store(self, batch: TaskBatch, connection: Any = None) -> list[UUID]:
        return drive(self.core.store(batch, connection), self.effects)

    @property
    def redis(self) -> NoReturn:
        _no_server()

    def close(self) -> None:
        pass


class MemoryAsyncProducer(AsyncProducer):
    def __init__(self, settings: Settings, core: ProducerCore, effects: Effects) -> None:
        super().__init__(settings, core)
        self.effects = effects

    async def store(self, batch: TaskBatch, connection: Any = None) -> list[UUID]:
        return await adrive(self.core.store(batch, connection), self._carry_out)

    async def _carry_out(self, effect: Effect) -> Any:
        return self.effects(effect)

    async def redis(self) -> NoReturn:
        _no_server()

    async def close(self) -> None:
        pass
