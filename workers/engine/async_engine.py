"""Runs the engine on a dedicated thread and bridges it to asyncio.

The event loop never calls the engine directly. It posts commands (add, abort,
run-this-function) to a thread-safe inbox; the engine thread applies them between
steps, so a cancellation is applied by the thread that owns the blocks, at the
next step boundary, and releases them there. Results travel back with
``loop.call_soon_threadsafe`` into one ``asyncio.Queue`` per request. While the
model runs, the loop stays free to serve HTTP.

Engine thread loop::

    while running:
        apply commands (block on the inbox when there is no work)
        outputs = engine.step()            # schedule -> run -> postprocess
        publish stats (and tell the loop when the load changed: ``load_changed``);
        hand outputs to the loop; publish new KV events

A request that fails alone (``RequestOutput.error``) ends its stream with an
``EngineError``. A step that fails as a whole (the batched model call) is counted and
aborts every request in flight (``Engine.fail_step``), and sets ``batch_failed`` until
someone (the worker's readiness keeper, ``workers.engine.selftest.keep_ready``) has
checked the engine again. If the thread itself dies, ``failed`` becomes True for good.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from workers.engine.engine import Engine
from workers.engine.kv_feed import KVEventFeed
from workers.engine.metrics import EngineStats
from workers.engine.request import (
    EngineError,
    GenerationRequest,
    RequestOutput,
    UnknownAdapterError,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


class QueueFullError(RuntimeError):
    """More requests in flight than the engine accepts (HTTP 429)."""


class DrainingError(RuntimeError):
    """The engine admits no new requests: the worker is draining before it exits
    (HTTP 503)."""


class RequestStream:
    """Async iterator over one request's outputs; the last one has ``finished`` True.

    ``close()`` (always call it, e.g. in ``finally``) aborts the request if it has not
    finished: its blocks are released by the engine thread at the next step.
    Raises ``EngineError`` if the engine failed while running the request.
    """

    def __init__(self, engine: AsyncEngine, request_id: int) -> None:
        self._engine = engine
        self.request_id = request_id
        self.queue: asyncio.Queue[RequestOutput | EngineError | UnknownAdapterError] = (
            asyncio.Queue())
        self.done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.done:
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, EngineError | UnknownAdapterError):
            self.done = True
            raise item
        self.done = item.finished
        return item

    async def token_ids(self) -> list[int]:
        """Read the request to its end and return every generated token id (all choices,
        in arrival order); closes the stream even when reading fails."""
        token_ids: list[int] = []
        try:
            async for output in self:
                for delta in output.deltas:
                    token_ids.extend(delta.token_ids)
        finally:
            self.close()
        return token_ids

    def close(self) -> None:
        """Stop listening; abort the request unless it already finished."""
        self._engine.forget(self, abort=not self.done)
        self.done = True


class AsyncEngine:
    """The engine thread plus the asyncio-side bookkeeping (loop thread only).

    ``max_in_flight`` bounds submitted, unfinished requests: ``submit`` beyond it
    raises ``QueueFullError``. After ``stop_admitting`` (drain) every ``submit``
    raises ``DrainingError`` while requests in flight run to their end.
    ``load_changed`` is set on the loop after a step whose stats changed the load a
    router routes by (``EngineStats.load_key``); whoever waits on it clears it.
    """

    def __init__(self, engine: Engine, kv_feed: KVEventFeed, max_in_flight: int) -> None:
        self._engine = engine
        self.kv_feed = kv_feed
        self._max_in_flight = max_in_flight
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._streams: dict[int, RequestStream] = {}
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.admitting = True
        self.failed = False
        self.batch_failed = asyncio.Event()
        self.stats: EngineStats = engine.stats()
        self.load_changed = asyncio.Event()
        self._load_key = self.stats.load_key

    # ---- lifecycle (loop thread) ---------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the engine thread; results are delivered on ``loop``."""
        self._loop = loop
        self.kv_feed.bind(loop)
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the engine thread after its current step (blocks until it exits)."""
        if self._thread is None:
            return
        self._inbox.put(self._request_stop)
        self._thread.join()
        self._thread = None

    def stop_admitting(self) -> None:
        """Refuse every later ``submit`` (``DrainingError``); requests in flight go on.
        Sets ``load_changed``: routers learn of the drain with the next load frame."""
        self.admitting = False
        self.load_changed.set()

    async def wait_idle(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Wait until no request is in flight, at most ``timeout_s``; True if none is."""
        deadline = time.monotonic() + timeout_s
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(poll_s)
        return not self._streams

    # ---- requests (loop thread) ----------------------------------------------------

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Queue ``request`` (validated by the caller); returns its output stream.
        Raises ``QueueFullError`` when full, ``DrainingError`` once draining,
        ``EngineError`` once the engine thread died."""
        if self.failed:
            raise EngineError("the engine thread has stopped")
        if not self.admitting:
            raise DrainingError("the worker is draining before it exits")
        if len(self._streams) >= self._max_in_flight:
            raise QueueFullError(f"{len(self._streams)} requests in flight")
        stream = RequestStream(self, next(self._ids))
        self._streams[stream.request_id] = stream
        arrival_time = time.monotonic()
        self._inbox.put(lambda: self._add(stream.request_id, request, arrival_time))
        return stream

    def forget(self, stream: RequestStream, abort: bool) -> None:
        """Drop ``stream`` (``RequestStream.close``); abort its request if asked."""
        if self._streams.pop(stream.request_id, None) is not None and abort:
            self._inbox.put(lambda: self._engine.abort_request(stream.request_id))

    @property
    def num_in_flight(self) -> int:
        """Requests submitted and not yet finished or closed."""
        return len(self._streams)

    async def call(self, fn: Callable[[Engine], T]) -> T:
        """Run ``fn(engine)`` on the engine thread between steps; return its result."""
        assert self._loop is not None, "start() first"
        loop = self._loop
        future: asyncio.Future[T] = loop.create_future()

        def run() -> None:
            try:
                result = fn(self._engine)
            except Exception as exc:  # handed to the awaiting coroutine
                loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)

        self._inbox.put(run)
        return await future

    def post(self, fn: Callable[[Engine], object]) -> None:
        """Queue ``fn(engine)`` on the engine thread after every command queued before it
        (the inbox is FIFO) and wait for nothing: safe in a ``finally`` or an ``except``
        of a cancelled task. A failure is logged."""

        def run() -> None:
            try:
                fn(self._engine)
            except Exception:
                log.exception("a posted engine command failed")

        self._inbox.put(run)

    # ---- engine thread -------------------------------------------------------------

    def _run(self) -> None:
        engine = self._engine
        try:
            while not self._stopping:
                self._apply(block=not engine.has_work())
                outputs = self._step() if engine.has_work() and not self._stopping else {}
                self.stats = engine.stats()
                if self.stats.load_key != self._load_key:
                    self._load_key = self.stats.load_key
                    self._post(self.load_changed.set)
                if outputs:
                    self._post(self._deliver, outputs)
                self.kv_feed.publish()
        except BaseException:
            log.exception("the engine thread died; this worker can serve no more requests")
            self.failed = True
            self._post(self._fail, list(self._streams))
            raise

    def _add(self, request_id: int, request: GenerationRequest, arrival_time: float) -> None:
        try:
            self._engine.add_request(request_id, request, arrival_time)
        except UnknownAdapterError as exc:
            self._post(self._refuse, request_id, exc)
        except Exception:
            log.exception("could not queue request %d", request_id)
            self._engine.abort_request(request_id)
            self._post(self._fail, [request_id])

    def _apply(self, block: bool) -> None:
        try:
            command = self._inbox.get(block=block)
            while True:
                command()
                command = self._inbox.get_nowait()
        except queue.Empty:
            return

    def _step(self) -> dict[int, RequestOutput]:
        try:
            return self._engine.step()
        except Exception as exc:
            log.exception("engine step failed; aborting every request in flight")
            self._post(self._fail, self._engine.fail_step(exc))
            self._post(self.batch_failed.set)
            return {}

    def _request_stop(self) -> None:
        self._stopping = True

    def _post(self, fn: Callable[..., None], *args: object) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed during shutdown: nobody is listening
            log.debug("event loop closed; dropping engine results")

    # ---- back on the loop thread ---------------------------------------------------

    def _deliver(self, outputs: dict[int, RequestOutput]) -> None:
        for request_id, output in outputs.items():
            stream = self._streams.get(request_id)
            if stream is not None:
                stream.queue.put_nowait(output if output.error is None
                                        else EngineError(output.error))
                if output.finished:
                    del self._streams[request_id]

    def _refuse(self, request_id: int, error: UnknownAdapterError) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.queue.put_nowait(error)

    def _fail(self, request_ids: list[int]) -> None:
        for request_id in request_ids:
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.queue.put_nowait(EngineError("the engine failed while running this request"))


def _settle(future: asyncio.Future[T], result: T | None, error: Exception | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]
