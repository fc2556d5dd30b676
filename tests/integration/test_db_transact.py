"""`db.transact` against the real PostgreSQL: BEGIN travels with an
operation's first statements, in one round trip, and every way out of that
start (a failure, a COPY, a nested transaction) leaves the connection as
`conn.transaction()` would."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from rota.core import db
from rota.core.db import Execute, Op, Send
from rota.core.load import SMALL_LOAD
from tests.helpers import envelopes, load

Conn = psycopg.Connection[Any]


class RoundTrips:
    """A TCP relay in front of PostgreSQL that counts the client's waits: its
    flights of bytes after the server said it was ready for more (Ready for
    query, or COPY's Copy in response). Messages the server sends before then
    (it may flush a pipeline's early results) end no wait."""

    READY = (ord("Z"), ord("G"))

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.count = 0
        self._ready = False
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection(self.target)
        threading.Thread(target=self._from_client, args=(client, server), daemon=True).start()
        self._from_server(server, client)

    def _from_client(self, client: socket.socket, server: socket.socket) -> None:
        while data := client.recv(65536):
            with self._lock:
                self.count += self._ready
                self._ready = False
            server.sendall(data)
        server.close()

    def _from_server(self, server: socket.socket, client: socket.socket) -> None:
        pending = b""
        while data := server.recv(65536):
            pending += data
            # Each message: a type byte, then its length (itself included).
            while len(pending) >= 5 and len(pending) >= 1 + int.from_bytes(pending[1:5]):
                kind, pending = pending[0], pending[1 + int.from_bytes(pending[1:5]) :]
                if kind in self.READY:
                    with self._lock:
                        self._ready = True
            client.sendall(data)
        client.close()


@pytest.fixture
def relayed(database_url: str) -> Iterator[tuple[Conn, RoundTrips]]:
    parts = urlsplit(database_url)
    relay = RoundTrips((parts.hostname or "127.0.0.1", parts.port or 5432))
    netloc = f"{parts.username}@127.0.0.1:{relay.port}"
    # No TLS or GSS negotiation: their one-byte answers are not messages.
    url = urlunsplit(parts._replace(netloc=netloc, query="sslmode=disable&gssencmode=disable"))
    with db.connect(url) as conn:
        yield conn, relay


def _sends_then_reads() -> Op[list[Any]]:
    yield Send("CREATE TEMP TABLE scratch (n int)")
    yield Send("INSERT INTO scratch VALUES (1), (2)")
    rows: list[Any] = yield Execute("SELECT sum(n) FROM scratch")
    return rows


def test_begin_the_sends_and_the_first_read_take_one_round_trip(
    relayed: tuple[Conn, RoundTrips],
) -> None:
    conn, relay = relayed
    before = relay.count
    assert db.transact(conn, _sends_then_reads()) == [(3,)]
    assert relay.count - before == 2  # BEGIN .. SELECT; COMMIT


def test_a_small_load_takes_one_round_trip_and_a_large_one_four(
    relayed: tuple[Conn, RoundTrips],
) -> None:
    conn, relay = relayed
    load(conn, envelopes("warm", 1))  # names made, statements known
    before = relay.count
    assert load(conn, envelopes("warm", 1)) == 1  # one INSERT, its own transaction
    assert relay.count - before == 1
    before = relay.count
    assert load(conn, envelopes("warm", SMALL_LOAD + 1)) == SMALL_LOAD + 1
    # BEGIN, SAVEPOINT and the preparation; COPY; its rows; COMMIT.
    assert relay.count - before == 4


def _alone_then_more() -> Op[None]:
    yield Execute("CREATE TABLE alone_done (n int)", alone=True)
    yield Execute("SELECT 1")


def test_a_statement_marked_alone_must_be_the_only_one(conn: Conn) -> None:
    with pytest.raises(RuntimeError, match="alone"):
        db.transact(conn, _alone_then_more())


def test_a_small_load_inside_an_open_transaction_is_part_of_it(conn: Conn) -> None:
    with conn.transaction(force_rollback=True):
        assert load(conn, envelopes("alice", 3)) == 3
        assert load(conn, envelopes("alice", 3)) == 3
    assert conn.execute("SELECT count(*) FROM rota.tasks").fetchone() == (0,)


def _fails_at_the_first_read() -> Op[None]:
    yield Send("CREATE TABLE half_done (n int)")
    yield Execute("SELECT 1 / 0")


def _only_sends() -> Op[None]:
    yield Send("CREATE TABLE sent_only (n int)")
    yield Send("SELECT 1 / 0")


@pytest.mark.parametrize(
    ("operation", "table"),
    [
        # A failure in the first round trip rolls everything back.
        (_fails_at_the_first_read, "half_done"),
        # An operation of Sends only fails whole when one fails.
        (_only_sends, "sent_only"),
    ],
)
def test_a_failed_statement_rolls_the_whole_operation_back(
    conn: Conn, operation: Callable[[], Op[None]], table: str
) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero):
        db.transact(conn, operation())
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert conn.execute("SELECT to_regclass(%s)", [table]).fetchone() == (None,)


def _recovers_from_a_failed_send() -> Op[list[Any]]:
    yield Send("SAVEPOINT before_bad")
    yield Send("SELECT 1 / 0")
    try:
        yield Execute("SELECT 1")
    except psycopg.errors.DivisionByZero:
        yield Execute("ROLLBACK TO SAVEPOINT before_bad")
    rows: list[Any] = yield Execute("SELECT 2")
    return rows


def test_a_failed_send_is_thrown_at_the_next_read_and_can_be_handled(conn: Conn) -> None:
    assert db.transact(conn, _recovers_from_a_failed_send()) == [(2,)]
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_inside_an_open_transaction_it_is_a_savepoint(conn: Conn) -> None:
    with conn.transaction(force_rollback=True):
        with pytest.raises(psycopg.errors.DivisionByZero):
            db.transact(conn, _fails_at_the_first_read())
        assert db.transact(conn, _sends_then_reads()) == [(3,)]
        assert conn.execute("SELECT to_regclass('half_done')").fetchone() == (None,)


def test_a_batch_loaded_twice_in_one_transaction_is_stored_once(conn: Conn) -> None:
    batch = envelopes("alice", 20)
    with conn.transaction():
        assert load(conn, batch) == 20
        assert load(conn, batch + envelopes("bob", 5)) == 5
    assert conn.execute("SELECT count(*) FROM rota.tasks").fetchone() == (25,)


def test_the_asyncio_driver_does_the_same(database_url: str) -> None:
    async def main() -> tuple[list[Any], bool]:
        async with await db.aconnect(database_url) as conn:
            rows = await db.atransact(conn, _sends_then_reads())
            with pytest.raises(psycopg.errors.DivisionByZero):
                await db.atransact(conn, _fails_at_the_first_read())
            cur = await conn.execute("SELECT to_regclass('half_done') IS NULL")
            (gone,) = await cur.fetchone()  # type: ignore[misc]
            assert await db.atransact(conn, _recovers_from_a_failed_send()) == [(2,)]
            return rows, gone

    assert asyncio.run(main()) == ([(3,)], True)
