"""Server-sent event streams (``data:`` lines) as the router and the workers send them:
one reader for the benchmarks and the tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any


def data_lines(text: str) -> list[str]:
    """The payloads of the ``data: `` lines of a whole stream ``text``, in order, as
    they stand (``[DONE]`` included)."""
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def data_payload(line: str) -> str | None:
    """The payload of one stream line, white space stripped around it and after
    ``data:``; None when the line is not a ``data:`` line."""
    line = line.strip()
    if not line.startswith("data:"):
        return None
    return line[len("data:"):].strip()


async def data_payloads(content: AsyncIterable[bytes]) -> AsyncIterator[str]:
    """The payload of each ``data:`` line of a streamed body (an aiohttp response's
    ``content``), in order, as it arrives; ``[DONE]`` included, other lines skipped.
    Bytes that are not UTF-8 read as U+FFFD."""
    async for raw in content:
        payload = data_payload(raw.decode(errors="replace"))
        if payload is not None:
            yield payload


async def json_events(content: AsyncIterable[bytes]) -> AsyncIterator[dict[str, Any]]:
    """The JSON object of each ``data: {...}`` line of a streamed body, in order, as it
    arrives; ``[DONE]`` and every other line skipped."""
    async for payload in data_payloads(content):
        if payload.startswith("{"):
            yield json.loads(payload)
