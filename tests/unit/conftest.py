"""The unit tier runs without servers: fakeredis stands in for Redis, and
nothing here may reach a network.

While a unit test is set up and run (its fixtures of any scope included),
connecting or binding an internet socket fails with `NetworkInUnitTest`, as
does opening a PostgreSQL connection (libpq connects from C, past Python's
socket module). AF_UNIX sockets stay allowed: asyncio's self-pipe is a
socketpair, and local pipes are no server. A test that needs a server
belongs in tests/integration.
"""

from __future__ import annotations

import socket
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from psycopg._connection_base import BaseConnection


class NetworkInUnitTest(RuntimeError):
    """A unit test tried to use the network (or a server)."""


def _refuse(what: str) -> NetworkInUnitTest:
    return NetworkInUnitTest(
        f"{what} in a unit test: tests/unit runs without servers or network "
        "(fakeredis stands in for Redis); move the test to tests/integration"
    )


def _is_local_pipe(sock: socket.socket) -> bool:
    return sock.family == getattr(socket, "AF_UNIX", None)


_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex
_bind = socket.socket.bind


def _guarded_connect(self: socket.socket, address: Any) -> None:
    if not _is_local_pipe(self):
        raise _refuse(f"socket connect to {address!r}")
    _connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    if not _is_local_pipe(self):
        raise _refuse(f"socket connect to {address!r}")
    return _connect_ex(self, address)


def _guarded_bind(self: socket.socket, address: Any) -> None:
    if not _is_local_pipe(self):
        raise _refuse(f"socket bind to {address!r}")
    _bind(self, address)


def _guarded_postgres(cls: type, conninfo: str = "") -> Any:
    raise _refuse("a PostgreSQL connection")


@contextmanager
def no_network() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", _guarded_connect)
        patch.setattr(socket.socket, "connect_ex", _guarded_connect_ex)
        patch.setattr(socket.socket, "bind", _guarded_bind)
        patch.setattr(BaseConnection, "_connect_gen", classmethod(_guarded_postgres))
        yield


# Hooks of this conftest run for the items under tests/unit only. Teardown is
# guarded too, but not the last test's of the run: the session's fixtures
# (servers of the other tiers) are torn down then.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with no_network():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with no_network():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, None, None]:
    if nextitem is None:
        return (yield)
    with no_network():
        return (yield)
