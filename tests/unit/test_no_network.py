"""The unit tier's guard (tests/unit/conftest.py): a unit test that reaches
for the network or starts a server fails, with a message saying why."""

from __future__ import annotations

import asyncio
import socket

import psycopg
import pytest
import redis

from rota_tools import devservers
from tests.unit.conftest import NetworkInUnitTest


def test_connecting_a_socket_fails() -> None:
    with pytest.raises(NetworkInUnitTest, match="tests/integration"):
        socket.create_connection(("127.0.0.1", 9), timeout=0.1)
    with socket.socket(socket.AF_INET6) as sock, pytest.raises(NetworkInUnitTest):
        sock.connect_ex(("::1", 9))


def test_listening_fails() -> None:
    with socket.socket() as sock, pytest.raises(NetworkInUnitTest, match="bind"):
        sock.bind(("127.0.0.1", 0))


def test_starting_a_server_fails() -> None:
    with pytest.raises(NetworkInUnitTest):
        devservers.start_redis()


def test_real_clients_fail() -> None:
    with pytest.raises(NetworkInUnitTest):
        redis.Redis(port=9, socket_connect_timeout=0.1).ping()
    with pytest.raises(NetworkInUnitTest, match="PostgreSQL"):
        psycopg.connect("postgresql://rota@127.0.0.1:9/postgres", connect_timeout=1)


@pytest.fixture
def reaches_out() -> None:
    socket.create_connection(("127.0.0.1", 9), timeout=0.1)


def test_fixtures_are_guarded_too(request: pytest.FixtureRequest) -> None:
    with pytest.raises(NetworkInUnitTest):
        request.getfixturevalue("reaches_out")


def test_local_pipes_and_event_loops_still_work() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"x")
        assert right.recv(1) == b"x"
    assert asyncio.run(asyncio.sleep(0, result=1)) == 1
