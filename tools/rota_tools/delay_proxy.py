"""A TCP proxy that adds latency: each chunk it forwards, either way, is held
for `delay` seconds after it arrived, in order. The network-fault suite puts
it between a process and a server to make a slow link (this kernel has no
netem); the delay changes while connections are open. With `record`, it
also notes when each chunk arrived, from which side of which connection
(`events`): what a round-trip count reads.

    with DelayProxy(("10.100.0.9", 6000), ("127.0.0.1", 5432)) as proxy:
        proxy.delay = 0.1   # 100 ms each way from now on
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import NamedTuple

CHUNK = 65536


class Chunk(NamedTuple):
    at: float  # time.time() when the proxy read it
    connection: int  # numbered from 1 in the order they were accepted
    from_client: bool
    head: bytes = b""  # its first byte (a PostgreSQL message's type)


class DelayProxy:
    """Listens on `listen`, forwards each connection to `target` with the
    current one-way `delay` added to every chunk, until closed."""

    def __init__(
        self, listen: tuple[str, int], target: tuple[str, int], *, record: bool = False
    ) -> None:
        self.listen = listen
        self.target = target
        self.delay = 0.0
        self.connections = 0
        self.events: list[Chunk] | None = [] if record else None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="delay-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._failure: BaseException | None = None

    def __enter__(self) -> DelayProxy:
        self._thread.start()
        self._ready.wait(10)
        if self._failure is not None:
            raise self._failure
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._connection, *self.listen)
            )
        except OSError as error:
            self._failure = error
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    async def _connection(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        try:
            server_in, server_out = await asyncio.open_connection(*self.target)
        except OSError:
            client_out.close()
            return
        self.connections += 1
        number = self.connections
        try:
            await asyncio.gather(
                self._pipe(client_in, server_out, number, True),
                self._pipe(server_in, client_out, number, False),
            )
        finally:
            for writer in (client_out, server_out):
                writer.close()

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        connection: int,
        from_client: bool,
    ) -> None:
        """Forwards `source` to `sink`, each chunk no sooner than `delay`
        after it was read; order is kept (a chunk waits behind the ones
        before it). An end of either side ends the pipe and closes `sink`."""
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def send() -> None:
            while (item := await held.get()) is not None:
                due, data = item
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                sink.write(data)
                await sink.drain()

        sender = asyncio.ensure_future(send())
        try:
            while data := await source.read(CHUNK):
                if self.events is not None:
                    self.events.append(Chunk(time.time(), connection, from_client, data[:1]))
                held.put_nowait((loop.time() + self.delay, data))
                if sender.done():
                    break
        except (ConnectionError, OSError):
            pass
        held.put_nowait(None)
        with contextlib.suppress(ConnectionError, OSError):
            await sender
        sink.close()
