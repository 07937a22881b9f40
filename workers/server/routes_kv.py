"""``GET /kv/events?since=N&epoch=E``: the worker's KV events as NDJSON.

If ``epoch`` is the current epoch and the log still holds every event after
``since``, those come first; otherwise (no ``since``, another epoch, too old) a
snapshot does: a ``cleared`` line and ``stored`` lines stamped with the head
``seq``. Live events follow; an empty line is a heartbeat. The stream ends if the
consumer falls too far behind; it then reconnects and resyncs.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from workers.server.errors import bad_request
from workers.server.state import STATE


def _since(request: web.Request) -> int | None:
    text = request.query.get("since")
    if text is None or text == "":
        return None
    if not text.isdigit() or len(text) > 19:
        raise bad_request("since must be a non-negative integer", "since")
    return int(text)


async def kv_events(request: web.Request) -> web.StreamResponse:
    """Stream KV events (see the module docstring)."""
    state = request.app[STATE]
    since = _since(request)
    epoch = request.query.get("epoch") or None
    feed = state.engine.kv_feed
    subscription = await state.engine.call(lambda _engine: feed.open(since, epoch))
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson",
                                           "Cache-Control": "no-cache"})
    heartbeat_s = state.config.kv_events_heartbeat_s
    try:
        await response.prepare(request)
        await response.write(b"".join(subscription.backlog))
        while not subscription.lost:
            try:
                async with asyncio.timeout(heartbeat_s):  # not wait_for: 3.11's can eat a cancel
                    lines = await subscription.queue.get()
            except TimeoutError:
                lines = [b"\n"]
            await response.write(b"".join(lines))
    except ConnectionError:
        return response
    finally:
        feed.close(subscription)
    return response
