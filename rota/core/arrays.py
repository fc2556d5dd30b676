"""Task ids as `uuid[]` parameters, each array dumped in one binary piece."""

from __future__ import annotations

import struct
from uuid import UUID

import psycopg
from psycopg.adapt import Buffer, Dumper
from psycopg.postgres import types as pg_types
from psycopg.pq import Format


class UUIDArray(list[UUID]):
    """Task ids for a `uuid[]` parameter, sent in one piece: psycopg's list
    dumper calls a Python dumper per element, a cost a loader pays on every
    task it loads and a worker on every task it reports."""


_UUID = pg_types["uuid"]
_ARRAY_HEADER = struct.Struct("!iiiii")  # dimensions, has nulls, element type, length, lower bound
_UUID_LENGTH = struct.pack("!i", 16)


class UUIDBytesArray(list[bytes]):
    """Task ids as their 16 bytes each (as `rota import` builds them), for a
    `uuid[]` parameter."""


def _uuid_array(raws: list[bytes]) -> bytes:
    """A one-dimensional uuid[] in binary, of each id's 16 bytes."""
    if not raws:
        return _ARRAY_HEADER.pack(0, 0, _UUID.oid, 0, 0)[:12]
    head = _ARRAY_HEADER.pack(1, 0, _UUID.oid, len(raws), 1)
    return head + _UUID_LENGTH + _UUID_LENGTH.join(raws)


class _UUIDArrayDumper(Dumper):
    format = Format.BINARY
    oid = _UUID.array_oid

    def dump(self, obj: UUIDArray) -> Buffer:
        # An id given as text (from a web request, say) is parsed: a bad one
        # raises ValueError here, before anything reaches the server.
        values = (u if type(u) is UUID else UUID(str(u)) for u in obj)
        return _uuid_array([u.int.to_bytes(16, "big") for u in values])


class _UUIDBytesArrayDumper(Dumper):
    format = Format.BINARY
    oid = _UUID.array_oid

    def dump(self, obj: UUIDBytesArray) -> Buffer:
        if any(len(raw) != 16 for raw in obj):
            raise ValueError("a task id is 16 bytes")
        return _uuid_array(obj)


psycopg.adapters.register_dumper(UUIDArray, _UUIDArrayDumper)
psycopg.adapters.register_dumper(UUIDBytesArray, _UUIDBytesArrayDumper)
