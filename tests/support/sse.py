"""Server-sent event streams as the router sends them to clients."""

from __future__ import annotations

import json
from typing import Any

from harness.sse import data_lines

# A streamed completions request that asks for the usage chunk.
STREAM = {"model": "demo", "prompt": "hello", "max_tokens": 3, "stream": True,
          "stream_options": {"include_usage": True}}


def sse_objects(text: str) -> list[Any]:
    """The JSON objects of a stream that ends with ``data: [DONE]`` (asserted)."""
    frames = data_lines(text)
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]
