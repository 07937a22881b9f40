"""``GET /kv/events?since=N&epoch=E``: the worker's KV events, as NDJSON or, for a
client that accepts ``application/x-msgpack``, as the binary frames of ``radix.events``
(what routers ask for).

If ``epoch`` is the current epoch and the log still holds every event after
``since``, those come first; otherwise (no ``since``, another epoch, too old) a
snapshot does: a ``cleared`` line and ``stored`` lines stamped with the head
``seq``. A heartbeat (an empty line or frame) follows at once, telling the consumer
it has caught up; live events follow, with a heartbeat whenever none came for
``kv_events_heartbeat_s``. The stream ends if the consumer falls too far behind; it
then reconnects and resyncs.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from workers.engine.kv_feed import BINARY, NDJSON
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
    form = BINARY if BINARY.content_type in request.headers.get("Accept", "") else NDJSON
    subscription = await state.engine.call(lambda _engine: feed.open(since, epoch, form))
    response = web.StreamResponse(headers={"Content-Type": form.content_type,
                                           "Cache-Control": "no-cache"})
    heartbeat_s = state.config.kv_events_heartbeat_s
    try:
        await response.prepare(request)
        await response.write(subscription.backlog)
        await response.write(form.heartbeat)
        while not subscription.lost:
            try:
                async with asyncio.timeout(heartbeat_s):  # not wait_for: 3.11's can eat a cancel
                    data = await subscription.queue.get()
            except TimeoutError:
                data = form.heartbeat
            await response.write(data)
    except ConnectionError:
        return response
    finally:
        feed.close(subscription)
    return response
