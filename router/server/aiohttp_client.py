"""``Client`` over an aiohttp request: the OpenAI routes on a connection the lean
server handed to aiohttp (``router.server.http1``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from aiohttp import web

from router.client import SSE_HEADERS, Client
from router.server.request_ids import request_id
from router.server.slow_clients import read_body


class AiohttpClient(Client):
    """``Client`` over an aiohttp request; ``response`` is what the handler returns."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self.request_id = request_id(request)
        self.response: web.StreamResponse | None = None

    def header(self, name: str) -> str | None:
        return self._request.headers.get(name)

    async def read_body(self, timeout_s: float, max_bytes: int) -> bytes:
        return await read_body(self._request, timeout_s, max_bytes)

    @property
    def started(self) -> bool:
        return self.response is not None and self.response.prepared

    async def start_stream(self) -> None:
        self.response = web.StreamResponse(headers=SSE_HEADERS)
        await self.response.prepare(self._request)

    async def write(self, data: bytes, timeout_s: float) -> None:
        assert self.response is not None
        async with asyncio.timeout(timeout_s):
            await self.response.write(data)

    def respond(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self.response = web.Response(status=status, body=body, headers=headers)

    def abort(self) -> None:
        if self._request.transport is not None:
            self._request.transport.abort()
