"""A loopback TCP proxy in front of one worker that can withhold its KV event stream.

Everything a client sends passes to the worker and everything the worker answers
passes back, except that while ``withhold`` is in force the answers to
``GET /kv/events`` stop flowing: their bytes wait in the worker's socket, not even a
heartbeat gets through, while every other request (``/ready``, ``/generate``) is
served as before. That is a worker whose event stream went silent while it serves:
a stuck stream, a half-open connection, an overloaded path to one router.

A connection is an event stream from the moment it sends ``GET /kv/events`` (the
router opens one per stream and never reuses it). The proxy runs its own event loop
on a thread, so synchronous tests drive it. Plain module, no pytest.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

_CHUNK_BYTES = 64 << 10
_WITHHELD_POLL_S = 0.02
_EVENTS_REQUEST = b"GET /kv/events"


class EventsProxy:
    """Proxies ``127.0.0.1:upstream_port``; ``url`` is where to reach it."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream_port = upstream_port
        self.withheld = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._connection, "127.0.0.1", 0), self._loop).result()
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def withhold(self) -> None:
        """Stop passing the worker's KV event streams (new ones included)."""
        self.withheld = True

    def release(self) -> None:
        """Pass them again, the bytes held back first."""
        self.withheld = False

    def close(self) -> None:
        """Stop listening, drop every connection and stop the thread."""
        async def stop() -> None:
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    async def _connection(self, client_reader: asyncio.StreamReader,
                          client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self._upstream_port)
        except OSError:
            client_writer.close()
            return
        is_events = asyncio.Event()
        try:
            await asyncio.gather(self._requests(client_reader, upstream_writer, is_events),
                                 self._answers(upstream_reader, client_writer, is_events))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            for writer in (client_writer, upstream_writer):
                writer.close()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        is_events: asyncio.Event) -> None:
        """Client to worker, noting an event stream request."""
        while chunk := await reader.read(_CHUNK_BYTES):
            if chunk.startswith(_EVENTS_REQUEST):
                is_events.set()
            writer.write(chunk)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       is_events: asyncio.Event) -> None:
        """Worker to client, held while an event stream is withheld."""
        while True:
            await self._flowing(is_events)
            chunk = await reader.read(_CHUNK_BYTES)
            if not chunk:
                return
            await self._flowing(is_events)  # withheld while this chunk was read
            writer.write(chunk)
            await writer.drain()

    async def _flowing(self, is_events: asyncio.Event) -> None:
        """Return once this connection's answers may pass."""
        while self.withheld and is_events.is_set():
            await asyncio.sleep(_WITHHELD_POLL_S)
