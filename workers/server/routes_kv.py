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

With ``load=1`` (``radix.events.LOAD_QUERY``) a binary stream also carries the
worker's load (``workers.server.load_push``): the answer has the header
``X-Load-Frames: 1``, a load frame follows the first heartbeat, another each time the
load changes, and the idle heartbeat is a load frame too.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from radix.events import LOAD_FRAMES_HEADER, LOAD_QUERY
from workers.engine.kv_feed import BINARY, NDJSON, Subscription
from workers.server.errors import bad_request
from workers.server.load_push import LoadPush
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
    load = (state.load_push if form is BINARY and request.query.get(LOAD_QUERY[0]) == LOAD_QUERY[1]
            else None)
    subscription = await state.engine.call(lambda _engine: feed.open(since, epoch, form))
    headers = {"Content-Type": form.content_type, "Cache-Control": "no-cache"}
    if load is not None:
        headers[LOAD_FRAMES_HEADER] = "1"
        load.subscribe(subscription)
    response = web.StreamResponse(headers=headers)
    try:
        await _stream(request, response, subscription, state.config.kv_events_heartbeat_s, load)
    except ConnectionError:
        pass
    finally:
        feed.close(subscription)
        if load is not None:
            load.unsubscribe(subscription)
    return response


async def _stream(request: web.Request, response: web.StreamResponse,
                  subscription: Subscription, heartbeat_s: float, load: LoadPush | None) -> None:
    """Write ``subscription``'s backlog, the heartbeat that marks it caught up, then
    live batches, with a heartbeat (a load frame when ``load`` is given) whenever none
    came for ``heartbeat_s``, until the subscription is lost."""
    heartbeat = subscription.form.heartbeat
    await response.prepare(request)
    await response.write(subscription.backlog)
    await response.write(heartbeat)
    if load is not None:
        await response.write(load.frame())
    while not subscription.lost:
        try:
            async with asyncio.timeout(heartbeat_s):  # not wait_for: 3.11's can eat a cancel
                data = await subscription.queue.get()
        except TimeoutError:
            data = heartbeat if load is None else load.frame()
        await response.write(data)
