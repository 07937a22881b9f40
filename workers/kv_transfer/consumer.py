"""``Consumer``: pulls the blocks of a prompt that another worker prefilled, the ones its
own cache lacks, and imports them before the request runs.

Before any byte moves, the consumer checks what the producer's params claim: the same
namespace digest (model, weights, tokenizer, RoPE, KV dtype and layout, FP8 scales),
block size and dtype, and block hashes equal to the ones it computes itself for the
prompt's whole blocks (so the blocks are this prompt's, in this scope). Params that name
no block cost no connection. Received blocks are never public: the consumer pulls only
when it already caches the prompt's whole public prefix itself (else ``public_prefix``,
before connecting), so every received block lies past it and is cached under the
request's scope. It asks for the blocks past the whole-block prefix it already caches
under a fresh nonce, authenticates every frame of the answer under that nonce and the
worker key before reading it (``wire``), checks each block's index, hash and size,
imports them (``KVCacheManager.import_blocks``: written into fresh blocks, cached,
announced in its KV events, held until ``release``), then acknowledges so the producer
lets go, in the background (the request runs at once; the ack waits at most
``ack_timeout_s``: a producer that never answers is counted, and the import stands).
Every failure is a ``TransferError`` with its reason; nothing is imported unless every
block arrived, and a pull that fails or is cancelled holds nothing (its import pin goes
through the ``PinLedger``). Once the consumer has the params it owns their release: a
pull that times out, is cancelled (its client hung up) or breaks off after asking for
blocks acknowledges the producer in the background, so the hold ends at once. What this
worker holds of the prompt counts its host and disk tiers too: their blocks that
continue its device prefix are restored first (``KVCacheManager.cached_prefix``), so it
never pulls a block it can restore. Pulls of the same blocks into this worker run one at
a time (``_one_at_a_time``: a fork's sub-agents sent here together): the later ones
start once the earlier has imported (together: each pins those blocks as cached in one
engine command, without a lookup first, and fetches nothing), instead of importing
every copy (which may not fit). A hold for another worker that waits for blocks a pull
is bringing here (``wait_for_blocks``) waits on that pull in the event loop, not by
asking the engine thread (a busy one answers once per step) whether they are cached yet,
and only until the pull starts receiving: each pull's blocks are kept, checked, in an
``Incoming`` as they arrive, which the producer relays from (docs/pd.md, "Relays").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass

from radix.keys import TOKEN_BYTES
from radix.kv_transfer import RemotePrefill
from workers.engine.async_engine import AsyncEngine
from workers.kv.ids import SeqId
from workers.kv_transfer.identity import TransferIdentity
from workers.kv_transfer.incoming import Incoming, Signal
from workers.kv_transfer.metrics import TransferMetrics
from workers.kv_transfer.pins import PinLedger
from workers.kv_transfer.wire import (
    MAX_ANSWER_HEADER_BYTES,
    REQUEST_CONTEXT,
    TransferError,
    answer_context,
    new_nonce,
    receive,
    send,
)

log = logging.getLogger(__name__)
ABANDONING_REASONS = frozenset({"timeout", "protocol", "evicted"})
# Chains imported lately that a hold may be waiting for, remembered at most this many.
MAX_IMPORTED_CHAINS = 256


@dataclass(frozen=True)
class Pulled:
    """A finished pull: the pin holding the prompt's blocks (release it once the
    request is admitted or over), the blocks this worker already had, and the blocks
    it received."""

    pin_id: SeqId
    num_local_blocks: int
    num_received_blocks: int


class Consumer:
    """The consumer side (see the module docstring)."""

    def __init__(self, engine: AsyncEngine, identity: TransferIdentity, key: bytes,
                 timeout_s: float, ack_timeout_s: float, ledger: PinLedger,
                 metrics: TransferMetrics) -> None:
        self._engine = engine
        self._identity = identity
        self._key = key
        self._timeout_s = timeout_s
        self._ack_timeout_s = ack_timeout_s
        self._ledger = ledger
        self._metrics = metrics
        self._acks: set[asyncio.Task[None]] = set()
        self._pulling: dict[tuple[str, str], asyncio.Event] = {}
        self._imported: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._incoming: list[Incoming] = []
        self._progress = Signal()  # a pull began receiving, or ended

    async def pull(self, remote: RemotePrefill, key: bytes, scope: str,
                   num_public_tokens: int) -> Pulled:
        """Pull and import what this worker lacks of ``remote``'s blocks for the prompt
        ``key``; the caller owns the returned pin (``release`` it). TransferError
        (counted by reason) on any failure; failed or cancelled, it holds nothing, and
        after a timeout, a cancellation or a broken transfer the producer is told to
        let go (in the background)."""
        started = time.monotonic()
        try:
            async with (asyncio.timeout(self._timeout_s),
                        self._one_at_a_time(remote, scope) as imported_here):
                pulled = await self._pull(remote, key, scope, num_public_tokens, imported_here)
                if remote.block_hashes:
                    self._note_imported((scope, remote.block_hashes[-1]))
        except TimeoutError:
            self._metrics.failures.labels("timeout").inc()
            self._acknowledge_later(remote)
            raise TransferError("timeout", f"the pull took over {self._timeout_s:g} s") from None
        except TransferError as exc:
            self._metrics.failures.labels(exc.reason).inc()
            if exc.reason in ABANDONING_REASONS:
                self._acknowledge_later(remote)
            raise
        except asyncio.CancelledError:
            self._acknowledge_later(remote)
            raise
        self._metrics.pull_seconds.observe(time.monotonic() - started)
        return pulled

    @contextlib.asynccontextmanager
    async def _one_at_a_time(self, remote: RemotePrefill, scope: str) -> AsyncIterator[bool]:
        """Wait while another pull of the same last block (so the same chain) for
        ``scope`` runs, then run this one (others wait for it); once one has imported
        the chain, the pulls that waited for it run together. Yields whether this one
        waited for a pull that imported the chain (it should find it cached)."""
        if not remote.block_hashes:
            yield False
            return
        key = (scope, remote.block_hashes[-1])
        while (running := self._pulling.get(key)) is not None:
            await running.wait()
            if key in self._imported:
                yield True
                return
        self._imported.pop(key, None)  # pulled again: what was imported is gone
        done = self._pulling[key] = asyncio.Event()
        try:
            yield False
        finally:
            del self._pulling[key]
            done.set()
            self._progress.fire()

    async def wait_for_blocks(self, scope: str, hashes: list[str], timeout_s: float
                              ) -> Incoming | bool:
        """Wait, at most ``timeout_s``, while a pull of the chain ``hashes`` (block 0 on)
        for ``scope`` runs here and receives nothing yet. The pull's ``Incoming`` once
        one that brings those blocks receives them (a relay may send them on as they
        arrive); True once a pull of exactly that chain has imported (now or lately);
        False when none runs, it failed, or the time ran out."""
        key = (scope, hashes[-1])
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while key not in self._imported:
                    incoming = next((i for i in self._incoming if i.covers(scope, hashes)),
                                    None)
                    if incoming is not None:
                        return incoming
                    if key not in self._pulling:
                        return False
                    await self._progress.wait()
        return key in self._imported

    def _note_imported(self, key: tuple[str, str]) -> None:
        self._imported[key] = None
        self._imported.move_to_end(key)
        while len(self._imported) > MAX_IMPORTED_CHAINS:
            self._imported.popitem(last=False)

    async def release(self, pulled: Pulled) -> None:
        """Let the imported blocks go (they stay cached, evictable); cancelling the wait
        does not cancel the release."""
        await self._ledger.free(pulled.pin_id)

    async def close(self) -> None:
        """Cancel the acknowledgements still in flight."""
        for task in list(self._acks):
            task.cancel()
        await asyncio.gather(*self._acks, return_exceptions=True)

    async def _pull(self, remote: RemotePrefill, key: bytes, scope: str,
                    num_public_tokens: int, imported_here: bool) -> Pulled:
        """Check ``remote``'s params, then import what this worker lacks. A chain that a
        pull just imported here (``imported_here``) is pinned at once, without a lookup
        first (each engine command waits for the step in progress); should part of it
        be gone already, the pull goes on as any other."""
        ident = self._identity
        for name, theirs, mine in (("namespace", remote.namespace, ident.namespace),
                                   ("block_size", remote.block_size, ident.block_size),
                                   ("kv_dtype", remote.kv_dtype, ident.kv_dtype)):
            if theirs != mine:
                raise TransferError("mismatch", f"the producer's {name} {theirs!r} differs "
                                                f"from this worker's {mine!r}")
        wanted = list(remote.block_hashes)
        if wanted != ident.block_hashes(key, scope, num_public_tokens)[: len(wanted)]:
            raise TransferError("mismatch", "the producer's block hashes do not name this "
                                            "prompt's blocks")
        if imported_here:
            pulled = await self._import(remote, wanted, key, scope, num_public_tokens,
                                        len(wanted), [])
            if pulled is not None:
                return pulled
        step = ident.block_size
        num_cached = await self._engine.call(
            lambda e: e.manager.cached_prefix(key[: len(wanted) * step * TOKEN_BYTES], scope))
        num_local = min(num_cached // step, len(wanted))
        if num_local < min(num_public_tokens // step, len(wanted)):
            raise TransferError("public_prefix", "this worker lacks part of the prompt's "
                                                 "public prefix: received blocks are never "
                                                 "made public, so it computes the prompt")
        incoming = Incoming(scope, wanted, num_local)
        self._incoming.append(incoming)
        self._progress.fire()
        try:
            if not incoming.complete:  # nothing to fetch when every block is here already
                await self._fetch(remote, incoming)
            pulled = await self._import(remote, wanted, key, scope, num_public_tokens,
                                        num_local, incoming.blocks)
        finally:
            self._incoming.remove(incoming)
            incoming.stop("the pull into the relaying worker failed")
        if pulled is None:
            raise TransferError("evicted", "this worker's own part of the prefix was "
                                           "evicted during the pull, or no room for the "
                                           "blocks")
        return pulled

    async def _import(self, remote: RemotePrefill, wanted: list[str], key: bytes, scope: str,
                      num_public_tokens: int, num_local: int, blocks: list[bytes]
                      ) -> Pulled | None:
        """Pin the prompt's first ``num_local`` blocks as cached here and import
        ``blocks`` after them, in one engine command; None, holding nothing, when the
        local part is no longer cached or there is no room."""
        ident = self._identity
        pin_id, imported = await self._ledger.pin(lambda e, p: e.manager.import_blocks(
            p, key, scope, num_public_tokens, num_local * ident.block_size, blocks))
        if not imported:
            self._ledger.free_later(pin_id)
            return None
        if wanted:  # params that name no block held nothing: no connection
            self._acknowledge_later(remote)  # the request need not wait for the producer
        self._metrics.blocks_received.inc(len(blocks))
        self._metrics.bytes_received.inc(len(blocks) * ident.block_bytes)
        return Pulled(pin_id, num_local, len(blocks))

    async def _connect(self, remote: RemotePrefill
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_connection(remote.host, remote.port)
        except OSError as exc:
            raise TransferError("unreachable", f"cannot reach the producer at "
                                               f"{remote.host}:{remote.port}: {exc}") from exc

    async def _fetch(self, remote: RemotePrefill, incoming: Incoming) -> None:
        """Ask ``remote`` for ``incoming``'s blocks and add each to it as it arrives,
        checked."""
        ident = self._identity
        wanted, first = incoming.hashes, incoming.first
        reader, writer = await self._connect(remote)
        nonce = new_nonce()
        context = answer_context(nonce)
        try:
            await send(writer, self._key, REQUEST_CONTEXT, {
                "op": "pull", "nonce": nonce, "transfer_id": remote.transfer_id,
                "first_block": first, "block_hashes": wanted[first:],
                "namespace": ident.namespace, "block_size": ident.block_size,
                "kv_dtype": ident.kv_dtype})
            status, _ = await receive(reader, self._key, context, MAX_ANSWER_HEADER_BYTES, 0)
            if status.get("ok") is not True:
                raise TransferError("refused", f"the producer refused the pull: "
                                               f"{status.get('error')}: {status.get('message')}")
            for index in range(first, len(wanted)):
                header, data = await receive(reader, self._key, context,
                                             MAX_ANSWER_HEADER_BYTES, ident.block_bytes)
                if (header.get("index") != index or header.get("hash") != wanted[index]
                        or len(data) != ident.block_bytes):
                    raise TransferError("protocol", f"block {index} arrived wrong"
                                        + (f": {header['message']}" if "message" in header
                                           else ""))
                incoming.add(data)
        except (ConnectionError, OSError) as exc:
            raise TransferError("unreachable", f"the producer went away: {exc}") from exc
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _acknowledge(self, remote: RemotePrefill) -> None:
        """Tell the producer it may let go, waiting at most ``ack_timeout_s`` (best
        effort: its deadline releases too); a producer that does not answer in time is
        counted in ``kv_transfer_ack_failures_total``."""
        try:
            async with asyncio.timeout(self._ack_timeout_s):
                reader, writer = await self._connect(remote)
                nonce = new_nonce()
                try:
                    await send(writer, self._key, REQUEST_CONTEXT, {
                        "op": "ack", "nonce": nonce, "transfer_id": remote.transfer_id})
                    await receive(reader, self._key, answer_context(nonce),
                                  MAX_ANSWER_HEADER_BYTES, 0)
                finally:
                    writer.close()
        except TimeoutError:
            self._metrics.ack_failures.inc()
            log.warning("KV transfer %s: %s did not answer the ack in %g s",
                        remote.transfer_id, remote.engine_id, self._ack_timeout_s)
        except (TransferError, ConnectionError, OSError):
            pass

    def _acknowledge_later(self, remote: RemotePrefill) -> None:
        """Acknowledge ``remote`` in a task of its own (bounded by ``ack_timeout_s``),
        so a failed or cancelled pull still ends the producer's hold at once."""
        task = asyncio.get_running_loop().create_task(self._acknowledge(remote))
        self._acks.add(task)
        task.add_done_callback(self._acks.discard)
