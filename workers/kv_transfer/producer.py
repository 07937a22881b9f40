"""``Producer``: holds prefilled prompts' blocks for their consumers and serves them.

``hold`` pins the prompt's cached whole blocks (``KVCacheManager.pin``: referenced
like a running sequence's, so nothing evicts or changes them) under a new transfer id
until the consumer acknowledges its pull or ``timeout_s`` passes. The transfer port
answers ``pull`` for the blocks of a held transfer only, after checking the key
(``wire``), the namespace, block size and dtype, and that the hashes asked for are
exactly those held at those positions (a stale, expired or forged block list is
refused before any byte of KV is sent). Blocks are read on the engine thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass

from radix.kv_transfer import RemotePrefill
from workers.engine.async_engine import AsyncEngine
from workers.kv.ids import SeqId
from workers.kv_transfer.identity import TransferIdentity
from workers.kv_transfer.metrics import TransferMetrics
from workers.kv_transfer.wire import TransferError, receive, send, verified

log = logging.getLogger(__name__)
EXPIRY_INTERVAL_S = 1.0
CONNECTION_TIMEOUT_S = 60.0


@dataclass
class _Held:
    pin_id: SeqId
    block_ids: list[int]
    block_hashes: list[str]
    since: float
    deadline: float


class Producer:
    """The producer side (see the module docstring). ``start`` opens the transfer port;
    ``close`` releases every hold."""

    def __init__(self, engine: AsyncEngine, identity: TransferIdentity, key: bytes,
                 timeout_s: float) -> None:
        self._engine = engine
        self._identity = identity
        self._key = key
        self._timeout_s = timeout_s
        self._held: dict[str, _Held] = {}
        self._server: asyncio.Server | None = None
        self._expirer: asyncio.Task[None] | None = None
        self.host = ""
        self.port = 0
        self.metrics: TransferMetrics | None = None

    def held_stats(self) -> tuple[int, float]:
        """(blocks held, age in seconds of the oldest hold)."""
        now = time.monotonic()
        return (sum(len(h.block_ids) for h in self._held.values()),
                max((now - h.since for h in self._held.values()), default=0.0))

    async def start(self, bind_host: str, port: int, advertised_host: str) -> None:
        """Listen on ``bind_host:port`` (0: a free port); consumers are told
        ``advertised_host``."""
        self._server = await asyncio.start_server(self._serve, bind_host, port)
        self.host, self.port = advertised_host, self._server.sockets[0].getsockname()[1]
        self._expirer = asyncio.create_task(self._expire())
        log.info("KV transfer port %s:%d (producer)", bind_host, self.port)

    async def close(self) -> None:
        """Stop serving and release every hold."""
        if self._expirer is not None:
            self._expirer.cancel()
        if self._server is not None:
            self._server.close()
        for transfer_id in list(self._held):
            await self.release(transfer_id)

    async def hold(self, key: bytes, scope: str, num_public_tokens: int) -> RemotePrefill:
        """Pin the cached whole blocks of the prompt ``key`` (after its prefill) and say
        where they wait. Without any cached block, the params name none (the consumer
        then computes the whole prompt)."""
        pin_id = self._identity.next_pin_id()
        block_ids = await self._engine.call(lambda e: e.manager.pin(pin_id, key, scope))
        hashes = self._identity.block_hashes(key, scope, num_public_tokens)[: len(block_ids)]
        transfer_id = uuid.uuid4().hex
        if block_ids:
            now = time.monotonic()
            self._held[transfer_id] = _Held(pin_id, block_ids, hashes, now,
                                            now + self._timeout_s)
        ident = self._identity
        return RemotePrefill(ident.engine_id, transfer_id, self.host, self.port,
                             tuple(block_ids), tuple(hashes), ident.block_size,
                             ident.kv_dtype, ident.namespace)

    async def release(self, transfer_id: str) -> bool:
        """Unpin a held transfer; False if it was not held."""
        held = self._held.pop(transfer_id, None)
        if held is None:
            return False
        await self._engine.call(lambda e: e.manager.free(held.pin_id))
        return True

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_INTERVAL_S)
            now = time.monotonic()
            for transfer_id in [t for t, h in self._held.items() if h.deadline <= now]:
                if await self.release(transfer_id):
                    log.warning("KV transfer %s expired unread after %g s", transfer_id,
                                self._timeout_s)
                    if self.metrics is not None:
                        self.metrics.expired.inc()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(CONNECTION_TIMEOUT_S):
                while True:
                    try:
                        header, _ = await receive(reader, 0)
                    except TransferError:
                        return
                    if not await self._answer(header, writer):
                        return
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, header: dict, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False to close the connection."""
        if not verified(self._key, header):
            await send(writer, {"ok": False, "error": "unauthorized",
                                "message": "the request is not signed with this worker's key"})
            return False
        transfer_id = header.get("transfer_id")
        if header.get("op") == "ack":
            await send(writer, {"ok": await self.release(str(transfer_id))})
            return False
        held = self._held.get(transfer_id) if isinstance(transfer_id, str) else None
        if held is None:
            await send(writer, {"ok": False, "error": "unknown_transfer",
                                "message": "no such transfer is held (expired, read, or never)"})
            return False
        if problem := self._mismatch(header, held):
            await send(writer, {"ok": False, "error": "mismatch", "message": problem})
            return False
        first, hashes = header["first_block"], header["block_hashes"]
        block_ids = held.block_ids[first: first + len(hashes)]
        blocks = await self._engine.call(
            lambda e: [e.manager.tensors.read_block(b) for b in block_ids])
        await send(writer, {"ok": True, "num_blocks": len(blocks)})
        for i, (block_hash, data) in enumerate(zip(hashes, blocks, strict=True)):
            await send(writer, {"index": first + i, "hash": block_hash}, data)
        if self.metrics is not None:
            self.metrics.blocks_sent.inc(len(blocks))
            self.metrics.bytes_sent.inc(sum(map(len, blocks)))
        return True

    def _mismatch(self, header: dict, held: _Held) -> str | None:
        ident = self._identity
        for name, mine in (("namespace", ident.namespace), ("block_size", ident.block_size),
                           ("kv_dtype", ident.kv_dtype)):
            if header.get(name) != mine:
                return f"{name} {header.get(name)!r} differs from the producer's {mine!r}"
        first, hashes = header.get("first_block"), header.get("block_hashes")
        if (not isinstance(first, int) or isinstance(first, bool) or first < 0
                or not isinstance(hashes, list)
                or hashes != held.block_hashes[first: first + len(hashes)]):
            return "the blocks asked for are not the ones held for this transfer"
        return None
