"""The transfer protocol's frames, on a plain TCP stream.

A frame is ``u32 header length, u32 payload length`` (big-endian), a JSON object,
then the payload bytes. A consumer sends ``pull`` and, after importing, ``ack``; the
producer answers ``pull`` with a status frame, then one frame per block (header:
its index in the prompt and its chained hash; payload: the block's bytes as
``KVCacheTensors.read_block`` gives them), and ``ack`` with a status frame.

Requests are authenticated with the worker key both ends share: ``mac`` is the
HMAC-SHA256 of the header's other fields (canonical JSON) under the key. A worker
without a key (loopback only) signs and checks with the empty key.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import struct
from typing import Any

FRAME = struct.Struct(">II")
MAX_HEADER_BYTES = 1 << 24


class TransferError(Exception):
    """A transfer failed; ``reason`` is its label (``unreachable``, ``timeout``,
    ``refused``, ``mismatch``, ``evicted``, ``protocol``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def sign(key: bytes, header: dict[str, Any]) -> dict[str, Any]:
    """``header`` with its ``mac``."""
    return {**header, "mac": _mac(key, header)}


def verified(key: bytes, header: dict[str, Any]) -> bool:
    """Whether ``header``'s ``mac`` is right for ``key``."""
    mac = header.get("mac")
    rest = {k: v for k, v in header.items() if k != "mac"}
    return isinstance(mac, str) and hmac.compare_digest(mac, _mac(key, rest))


def _mac(key: bytes, header: dict[str, Any]) -> str:
    body = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


async def send(writer: asyncio.StreamWriter, header: dict[str, Any], payload: bytes = b"") -> None:
    """Write one frame and wait for the buffer to drain."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    writer.write(FRAME.pack(len(raw), len(payload)) + raw + payload)
    await writer.drain()


async def receive(reader: asyncio.StreamReader, max_payload: int
                  ) -> tuple[dict[str, Any], bytes]:
    """Read one frame; TransferError ``protocol`` on a short, oversized or non-JSON one."""
    try:
        header_len, payload_len = FRAME.unpack(await reader.readexactly(FRAME.size))
        if header_len > MAX_HEADER_BYTES or payload_len > max_payload:
            raise TransferError("protocol", f"frame of {header_len} + {payload_len} bytes "
                                            f"is over the limit")
        header = json.loads(await reader.readexactly(header_len))
        payload = await reader.readexactly(payload_len) if payload_len else b""
    except asyncio.IncompleteReadError as exc:
        raise TransferError("protocol", "the stream ended inside a frame") from exc
    except ValueError as exc:
        raise TransferError("protocol", f"a frame header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise TransferError("protocol", "a frame header is not a JSON object")
    return header, payload
