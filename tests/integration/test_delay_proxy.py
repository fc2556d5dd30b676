"""The network suite's latency proxy (rota_tools.delay_proxy) on loopback:
bytes arrive whole and in order, each way no sooner than the delay set, and
a delay changed while a connection is open applies to what is sent next."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from rota_tools.delay_proxy import DelayProxy
from rota_tools.devservers import free_port


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[DelayProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with DelayProxy(("127.0.0.1", free_port()), server.server_address[:2]) as started:
            yield started
    finally:
        server.shutdown()
        server.server_close()


def _round_trip(conn: socket.socket, payload: bytes) -> tuple[bytes, float]:
    started = time.monotonic()
    conn.sendall(payload)
    got = b""
    while len(got) < len(payload):
        got += conn.recv(65536)
    return got, time.monotonic() - started


def test_bytes_go_both_ways_whole_in_order_and_late_by_the_delay(proxy: DelayProxy) -> None:
    with socket.create_connection(proxy.listen, timeout=10) as conn:
        payload = bytes(range(256)) * 4096  # 1 MiB: many chunks each way
        got, _ = _round_trip(conn, payload)
        assert got == payload
        proxy.delay = 0.15  # set while the connection is open
        got, took = _round_trip(conn, b"ping")
        assert got == b"ping"
        assert took >= 0.3  # held 0.15 s each way
        proxy.delay = 0.0
        assert _round_trip(conn, b"pong")[0] == b"pong"
    assert proxy.connections == 1
