"""Time limits for slow clients (slowloris): a connection's request head and a
request's body.

aiohttp has no header timeout, but its keep-alive timer is one: it starts when a
connection opens and again when a response ends; bytes of an unfinished request
head do not move it, and when it fires with no complete head waiting, the
connection is closed (the timer at connection open is aiohttp's since
aio-libs/aiohttp#13681; tests/router/server/test_slow_clients.py fails on a version
without it). So ``listen.keepalive_timeout_s`` bounds both an idle
kept-alive connection and the time a client has to send the line and headers of its
next request (``runner_options``). The body is read only through ``read_body``,
which gives it ``listen.body_timeout_s`` in all (408 when that runs out), so a
client that trickles a body holds a handler that long at most. This is the
aiohttp side (connections handed to it); the OpenAI routes' own server
(``router.server.http1``) applies the same two settings itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from radix.api_errors import ApiError
from router.client import body_too_large
from router.config import ListenConfig


def runner_options(listen: ListenConfig) -> dict[str, Any]:
    """The ``web.AppRunner`` options that bound a connection's idle time and head."""
    return {"keepalive_timeout": listen.keepalive_timeout_s}


async def read_body(request: web.Request, timeout_s: float, max_bytes: int | None = None
                    ) -> bytes:
    """The whole request body, read within ``timeout_s`` (ApiError 408 otherwise) and,
    with ``max_bytes``, refused with a 413 as soon as it passes that."""
    if max_bytes is not None and (request.content_length or 0) > max_bytes:
        raise body_too_large(max_bytes)
    try:
        async with asyncio.timeout(timeout_s):
            if max_bytes is None:
                return await request.read()
            parts, size = [], 0
            async for part in request.content.iter_any():
                size += len(part)
                if size > max_bytes:
                    raise body_too_large(max_bytes)
                parts.append(part)
            return b"".join(parts)
    except TimeoutError:
        raise ApiError(408, f"request body not received within {timeout_s:g} s",
                       code="request_timeout", headers={"Connection": "close"}) from None
