"""The transfer protocol's frames, on a plain TCP stream, authenticated before parsed.

A frame is ``u32 header length, u32 payload length`` (big-endian), a 32-byte MAC, the
header (a JSON object), then the payload bytes. The MAC is HMAC-SHA256, under the worker
key both ends share, of the frame's context (``u16`` length, then its bytes), the
lengths, the header bytes and the payload bytes. A receiver checks the lengths against
its bounds before it reads anything else, and the MAC (``hmac.compare_digest``) before
it parses the header: an unsigned or oversized frame costs it at most its bounds in
bytes and never a JSON parse.

Contexts keep frames from being moved between places: a consumer's request (``pull``,
``ack``) is signed in ``REQUEST_CONTEXT`` and carries a fresh ``nonce``; every frame of
the producer's answer is signed in ``answer_context(nonce)``, so a block frame is bound
to that pull, its index, its hash and its bytes, and a frame recorded from another pull
or forged without the key does not verify. A worker without a key (loopback only)
signs and checks with the empty key.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import secrets
import struct
from typing import Any

FRAME = struct.Struct(">II")
MAC_BYTES = 32
REQUEST_CONTEXT = b"radix-kv/1 request"
REFUSAL_CONTEXT = b"radix-kv/1 refusal"
MAX_ANSWER_HEADER_BYTES = 4096
# A pull's fixed fields (op, transfer id, nonce, namespace, ...) and, per block asked
# for, its hash as a JSON string (about 35 bytes for our 128-bit hashes).
PULL_HEADER_BASE_BYTES = 1024
PULL_HEADER_BYTES_PER_BLOCK = 72
_NONCE = re.compile(r"^[0-9a-f]{32}$")


class TransferError(Exception):
    """A transfer failed; ``reason`` is its label (``unreachable``, ``timeout``,
    ``refused``, ``mismatch``, ``evicted``, ``protocol``, ``unauthenticated``,
    ``oversized``, ``public_prefix``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def max_pull_header_bytes(max_blocks: int) -> int:
    """The largest pull header a producer reads: enough for a request naming every
    block of the longest prompt (``max_blocks`` blocks), and no more."""
    return PULL_HEADER_BASE_BYTES + PULL_HEADER_BYTES_PER_BLOCK * max_blocks


def new_nonce() -> str:
    """A fresh 128-bit nonce (hex) for one request."""
    return secrets.token_hex(16)


def answer_context(nonce: Any) -> bytes:
    """The context of the producer's answer to a request carrying ``nonce``;
    TransferError ``protocol`` when it is not a nonce of ``new_nonce``'s form."""
    if not isinstance(nonce, str) or not _NONCE.fullmatch(nonce):
        raise TransferError("protocol", "a request without a valid nonce")
    return b"radix-kv/1 answer " + nonce.encode()


def _mac(key: bytes, context: bytes, lengths: bytes, header: bytes, payload: bytes) -> bytes:
    mac = hmac.new(key, struct.pack(">H", len(context)) + context, hashlib.sha256)
    for part in (lengths, header, payload):
        mac.update(part)
    return mac.digest()


def frame(key: bytes, context: bytes, header: dict[str, Any], payload: bytes = b"") -> bytes:
    """One frame's bytes: ``header`` and ``payload`` signed under ``key`` in ``context``."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    lengths = FRAME.pack(len(raw), len(payload))
    return lengths + _mac(key, context, lengths, raw, payload) + raw + payload


async def send(writer: asyncio.StreamWriter, key: bytes, context: bytes,
               header: dict[str, Any], payload: bytes = b"") -> None:
    """Write one signed frame and wait for the buffer to drain."""
    writer.write(frame(key, context, header, payload))
    await writer.drain()


async def receive(reader: asyncio.StreamReader, key: bytes, context: bytes,
                  max_header: int, max_payload: int) -> tuple[dict[str, Any], bytes]:
    """Read one frame of at most ``max_header`` + ``max_payload`` bytes and authenticate
    it before parsing it. TransferError ``oversized`` when its lengths pass the bounds
    (nothing more is read), ``unauthenticated`` when its MAC is not ``key``'s in
    ``context`` (the header is never parsed), ``protocol`` on a cut frame or a header
    that is not a JSON object."""
    try:
        lengths = await reader.readexactly(FRAME.size)
        header_len, payload_len = FRAME.unpack(lengths)
        if header_len > max_header or payload_len > max_payload:
            raise TransferError("oversized", f"a frame of {header_len} + {payload_len} bytes "
                                             f"is over the {max_header} + {max_payload} allowed")
        mac = await reader.readexactly(MAC_BYTES)
        raw = await reader.readexactly(header_len)
        payload = await reader.readexactly(payload_len) if payload_len else b""
    except asyncio.IncompleteReadError as exc:
        raise TransferError("protocol", "the stream ended inside a frame") from exc
    if not hmac.compare_digest(mac, _mac(key, context, lengths, raw, payload)):
        raise TransferError("unauthenticated", "a frame is not signed with this worker's key")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise TransferError("protocol", f"a frame header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise TransferError("protocol", "a frame header is not a JSON object")
    return header, payload
