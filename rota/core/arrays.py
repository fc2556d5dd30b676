"""Arrays a worker sends with every report, each dumped in one binary piece:
task ids as `uuid[]`, attempts as `integer[]`, run times as `float8[]`.
psycopg's list dumper scans a list for its element type and calls a Python
dumper per element, a cost a loader pays on every task it loads and a worker
on every task it reports."""

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


class Int4Array(list[int]):
    """Integers (attempts) for an `integer[]` parameter, sent in one piece."""


class Float8Array(list[float | None]):
    """Numbers, None for NULL (a run's measures, where not told), for a
    `float8[]` parameter, sent in one piece."""


_INT4, _FLOAT8 = pg_types["int4"], pg_types["float8"]
_INT4_ELEMENT = struct.Struct("!ii")  # length 4, the value
_FLOAT8_ELEMENT = struct.Struct("!id")  # length 8, the value
_NULL_ELEMENT = struct.pack("!i", -1)


def _array(oid: int, elements: int, has_nulls: bool, body: bytes) -> bytes:
    if not elements:
        return _ARRAY_HEADER.pack(0, 0, oid, 0, 0)[:12]
    return _ARRAY_HEADER.pack(1, int(has_nulls), oid, elements, 1) + body


class _Int4ArrayDumper(Dumper):
    format = Format.BINARY
    oid = _INT4.array_oid

    def dump(self, obj: Int4Array) -> Buffer:
        # struct refuses a value outside int4 (struct.error), before the server.
        pack = _INT4_ELEMENT.pack
        return _array(_INT4.oid, len(obj), False, b"".join([pack(4, v) for v in obj]))


class _Float8ArrayDumper(Dumper):
    format = Format.BINARY
    oid = _FLOAT8.array_oid

    def dump(self, obj: Float8Array) -> Buffer:
        pack, null = _FLOAT8_ELEMENT.pack, _NULL_ELEMENT
        body = b"".join([null if v is None else pack(8, v) for v in obj])
        return _array(_FLOAT8.oid, len(obj), None in obj, body)


psycopg.adapters.register_dumper(UUIDArray, _UUIDArrayDumper)
psycopg.adapters.register_dumper(UUIDBytesArray, _UUIDBytesArrayDumper)
psycopg.adapters.register_dumper(Int4Array, _Int4ArrayDumper)
psycopg.adapters.register_dumper(Float8Array, _Float8ArrayDumper)
