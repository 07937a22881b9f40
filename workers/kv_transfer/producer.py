"""``Producer``: holds prefilled prompts' blocks for their consumers and serves them.

``hold`` pins the prompt's cached whole blocks (``KVCacheManager.pin``: referenced
like a running sequence's, so nothing evicts or changes them) under a new transfer id
until the consumer acknowledges its pull or ``timeout_s`` passes. The transfer port
answers ``pull`` for the blocks of a held transfer only, after checking the frame
(``wire``: its size within a pull's bound for this worker's longest prompt, then its
MAC under the worker key, before the header is parsed), the namespace, block size and
dtype, and that the hashes asked for are exactly those held at those positions (a
stale, expired or forged block list is refused before any byte of KV is sent); every
frame of the answer is signed under the pull's nonce. Blocks are read on a thread of
their own, not the engine thread: a held block is pinned, so nothing writes it while
it is held, and a pull from a busy worker waits for no engine step. The port serves one request per connection, at most ``MAX_CONNECTIONS`` at
once, each request read within ``REQUEST_TIMEOUT_S``; whatever one connection does
ends that connection only, counted in ``kv_transfer_port_refusals_total{reason}``.

Holds are bounded: each lives at most ``HoldLimits.timeout_s`` (``expire`` releases
it then), all of them together at most ``max_held_blocks`` and one tenant scope's at
most ``max_scope_held_blocks``, counted in distinct blocks (a block several holds pin,
a shared prefix many peers pull at once, is pinned once); a hold past a cap is refused
(``HoldRefused``) and pins nothing. Pins go through the ``PinLedger``, so a hold cancelled while the engine
is busy releases its blocks. A released hold charges its blocks times seconds held to
its scope (``TransferMetrics.charge``). A hold is the same whether a prefill leg
asked for it after running the prompt or a router asked a peer to hold what it
already caches (``POST /kv_transfer/hold``: nothing runs).

A hold on a worker still pulling the prompt's blocks (``hold`` given the pull's
``Incoming``) holds what it caches and relays the rest: each such block is sent once it
has arrived here, so a pull from a receiver runs behind the receiver's own pull instead
of after it (docs/pd.md, "Relays"); should that pull break off, the relayed pull is
told so in a signed frame and ends.

A timed worker (``link_s_per_block``) sends through a ``TimedLink``: each pull's
blocks wait their time on the profile's link, one pull after another, as on the one
NIC a real worker sends through, so concurrent pulls from one worker queue, in the
order they arrive (a pull takes its turn before its blocks are read, so one whose read
finishes first does not jump the queue). Each block leaves when it has crossed, not
the whole pull at its end, so a receiver can relay the first blocks while the last
still cross.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from radix.kv_transfer import RemotePrefill
from workers.kv.ids import SeqId
from workers.kv.tensors import KVCacheTensors
from workers.kv_transfer.identity import TransferIdentity
from workers.kv_transfer.incoming import Incoming
from workers.kv_transfer.metrics import TransferMetrics
from workers.kv_transfer.pins import PinLedger
from workers.kv_transfer.wire import (
    REFUSAL_CONTEXT,
    REQUEST_CONTEXT,
    TransferError,
    answer_context,
    max_pull_header_bytes,
    receive,
    send,
)

log = logging.getLogger(__name__)
CONNECTION_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64
# A timed link sends a block once its crossing time is this close (fewer, longer sleeps).
PACE_S = 0.002


class TimedLink:
    """A timed worker's outgoing transfer link: blocks cross it ``s_per_block`` each,
    after every block queued before them (0: at once)."""

    def __init__(self, s_per_block: float) -> None:
        self.s_per_block = s_per_block
        self._free_at = 0.0

    def queue(self, num_blocks: int) -> float:
        """Queue ``num_blocks`` blocks behind the link's earlier ones now; the monotonic
        time by which they have crossed it."""
        now = time.monotonic()
        if not self.s_per_block:
            return now
        self._free_at = max(now, self._free_at) + num_blocks * self.s_per_block
        return self._free_at


class HoldRefused(Exception):
    """A hold would pass a cap; ``cap`` is ``producer`` or ``scope``."""

    def __init__(self, cap: str, message: str) -> None:
        super().__init__(message)
        self.cap = cap


@dataclass(frozen=True)
class HoldLimits:
    """How long a hold lives, and the most blocks all holds, and one scope's, pin."""

    timeout_s: float
    max_held_blocks: int
    max_scope_held_blocks: int


@dataclass
class _Held:
    pin_id: SeqId
    scope: str
    block_ids: list[int]
    block_hashes: list[str]
    since: float
    deadline: float
    relay: Incoming | None = None  # the pull bringing the blocks past ``block_ids``

    def pins(self) -> list[int | str]:
        """What the hold counts against the caps: its pinned blocks by id, and the
        blocks it relays by hash (they are held in memory instead)."""
        return [*self.block_ids, *self.block_hashes[len(self.block_ids):]]


class Producer:
    """The producer side (see the module docstring). ``start`` opens the transfer port;
    ``close`` releases every hold."""

    def __init__(self, tensors: KVCacheTensors, identity: TransferIdentity, key: bytes,
                 limits: HoldLimits, ledger: PinLedger, metrics: TransferMetrics,
                 link: TimedLink | None = None) -> None:
        self._tensors = tensors
        self._link = link or TimedLink(0.0)
        self._identity = identity
        self._key = key
        self.limits = limits
        self._ledger = ledger
        self._held: dict[str, _Held] = {}
        self._pins: dict[str | None, Counter[int | str]] = {None: Counter()}  # scope: block: holds
        self._server: asyncio.Server | None = None
        self._num_connections = 0
        self.host = ""
        self.port = 0
        self.metrics = metrics
        metrics.max_held_blocks.set(limits.max_held_blocks)

    def held_stats(self) -> tuple[int, float]:
        """(blocks held, age in seconds of the oldest hold)."""
        now = time.monotonic()
        return (self.num_held_blocks(),
                max((now - h.since for h in self._held.values()), default=0.0))

    def num_held_blocks(self, scope: str | None = None) -> int:
        """Distinct blocks held for consumers now (only ``scope``'s, when given)."""
        return len(self._pins.get(scope, ()))

    def check_room(self, scope: str, num_blocks: int, pins: Sequence[int | str] = ()) -> None:
        """``HoldRefused`` (counted by cap) unless holding ``num_blocks`` more for
        ``scope`` (with ``pins``: those blocks, ``_Held.pins``, the ones held already
        not counted again) stays within both caps; changes nothing else."""
        limits = self.limits
        for cap, held, most in (("producer", self._pins[None], limits.max_held_blocks),
                                ("scope", self._pins.get(scope, Counter()),
                                 limits.max_scope_held_blocks)):
            num_held = len(held)
            if pins:
                num_blocks = sum(b not in held for b in set(pins))
            if num_held + num_blocks > most:
                self.metrics.refused.labels(cap).inc()
                raise HoldRefused(cap, f"holding {num_blocks} more blocks would pass the "
                                       f"{cap} cap ({num_held} of {most} held)")

    async def start(self, bind_host: str, port: int, advertised_host: str) -> None:
        """Listen on ``bind_host:port`` (0: a free port); consumers are told
        ``advertised_host``."""
        self._server = await asyncio.start_server(self._serve, bind_host, port)
        self.host, self.port = advertised_host, self._server.sockets[0].getsockname()[1]
        log.info("KV transfer port %s:%d (producer)", bind_host, self.port)

    async def close(self) -> None:
        """Stop serving and release every hold."""
        if self._server is not None:
            self._server.close()
        for transfer_id in list(self._held):
            await self.release(transfer_id)

    async def hold(self, key: bytes, scope: str, num_public_tokens: int,
                   relay: Incoming | None = None) -> RemotePrefill:
        """Pin the cached whole blocks of the prompt ``key`` (after its prefill) for
        ``scope`` until acknowledged, released or ``limits.timeout_s`` passes, and say
        where they wait. With ``relay`` (a pull into this worker bringing the prompt's
        blocks), the blocks it brings past the cached ones are held too, sent on as
        they arrive; the params name their hashes but no id (they have none here
        yet). Without any block, the params name none (the consumer then computes the
        whole prompt). ``HoldRefused``, holding nothing, past a cap; cancelled, it
        holds nothing either."""
        pin_id, block_ids = await self._ledger.pin(lambda e, p: e.manager.pin(p, key, scope))
        hashes = self._identity.block_hashes(key, scope, num_public_tokens)
        if (relay is None or not relay.first <= len(block_ids) < len(hashes)
                or not relay.covers(scope, hashes)):
            relay = None
            hashes = hashes[: len(block_ids)]
        held = _Held(pin_id, scope, block_ids, hashes, time.monotonic(), 0.0, relay)
        try:
            self.check_room(scope, len(hashes), held.pins())
        except HoldRefused:
            self._ledger.free_later(pin_id)
            raise
        transfer_id = uuid.uuid4().hex
        if hashes:
            held.deadline = held.since + self.limits.timeout_s
            self._held[transfer_id] = held
            for pins in (self._pins[None], self._pins.setdefault(scope, Counter())):
                pins.update(held.pins())
        else:
            self._ledger.free_later(pin_id)
        ident = self._identity
        return RemotePrefill(ident.engine_id, transfer_id, self.host, self.port,
                             tuple(block_ids), tuple(hashes), ident.block_size,
                             ident.kv_dtype, ident.namespace)

    async def release(self, transfer_id: str, reason: str | None = None) -> bool:
        """Unpin a held transfer, charge its block-seconds to its scope and count it
        under ``reason`` (``acknowledged``, ``abandoned``; None: not counted as a
        release); False if it was not held (never, expired, or released already)."""
        held = self._held.pop(transfer_id, None)
        if held is None:
            return False
        held_pins = held.pins()
        for key in (None, held.scope):
            pins = self._pins[key]
            pins.subtract(held_pins)
            for pin in held_pins:
                if pins[pin] <= 0:
                    del pins[pin]
            if key is not None and not pins:
                del self._pins[key]
        self.metrics.charge(held.scope, len(held_pins) * (time.monotonic() - held.since))
        if reason is not None:
            self.metrics.released.labels(reason).inc()
        await self._ledger.free(held.pin_id)
        return True

    async def expire(self) -> int:
        """Release every hold past its deadline (counted as expired); how many."""
        now = time.monotonic()
        num_expired = 0
        for transfer_id in [t for t, h in self._held.items() if h.deadline <= now]:
            if await self.release(transfer_id):
                log.warning("KV transfer %s expired unread after %g s", transfer_id,
                            self.limits.timeout_s)
                self.metrics.expired.inc()
                num_expired += 1
        return num_expired

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one request on a new connection: none past ``MAX_CONNECTIONS`` at once,
        the whole exchange within ``CONNECTION_TIMEOUT_S``; any failure ends this
        connection only (counted by reason), never the port."""
        if self._num_connections >= MAX_CONNECTIONS:
            self._refused("busy")
            writer.close()
            return
        self._num_connections += 1
        try:
            async with asyncio.timeout(CONNECTION_TIMEOUT_S):
                await self._serve_request(reader, writer)
        except TimeoutError:
            self._refused("timeout")
        except ConnectionError:
            pass
        except Exception:  # one bad peer or a bug in one answer never takes the port down
            log.exception("KV transfer connection failed")
            self._refused("error")
        finally:
            self._num_connections -= 1
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _serve_request(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        """Read one request within ``REQUEST_TIMEOUT_S``, authenticated before it is
        parsed (``wire.receive``), and answer it under its nonce; a refused one gets a
        refusal frame (signed in ``REFUSAL_CONTEXT``) and nothing else."""
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                header, _ = await receive(reader, self._key, REQUEST_CONTEXT,
                                          max_pull_header_bytes(self._identity.max_blocks), 0)
            context = answer_context(header.get("nonce"))
        except TransferError as exc:
            self._refused(exc.reason)
            await send(writer, self._key, REFUSAL_CONTEXT,
                       {"ok": False, "error": exc.reason, "message": str(exc)})
            return
        await self._answer(header, writer, context)

    def _refused(self, reason: str) -> None:
        self.metrics.port_refusals.labels(reason).inc()

    async def _answer(self, header: dict, writer: asyncio.StreamWriter, context: bytes
                      ) -> None:
        """Answer one authenticated request, every frame signed in ``context``."""

        async def say(answer: dict, payload: bytes = b"") -> None:
            await send(writer, self._key, context, answer, payload)

        transfer_id = header.get("transfer_id")
        if header.get("op") == "ack":
            await say({"ok": await self.release(str(transfer_id), "acknowledged")})
            return
        held = self._held.get(transfer_id) if isinstance(transfer_id, str) else None
        if held is None:
            await say({"ok": False, "error": "unknown_transfer",
                       "message": "no such transfer is held (expired, read, or never)"})
            return
        if problem := self._mismatch(header, held):
            await say({"ok": False, "error": "mismatch", "message": problem})
            return
        first, hashes = header["first_block"], header["block_hashes"]
        block_ids = held.block_ids[first: first + len(hashes)]
        link = self._link
        starts_at = link.queue(len(hashes)) - len(hashes) * link.s_per_block  # in turn
        blocks = await asyncio.to_thread(lambda: [self._tensors.read_block(b) for b in block_ids])
        await say({"ok": True, "num_blocks": len(hashes)})
        num_sent = 0
        try:
            for i, block_hash in enumerate(hashes):
                if i < len(blocks):
                    data = blocks[i]
                else:
                    assert held.relay is not None  # _mismatch: hashes past the ids are relayed
                    try:
                        data = await held.relay.block(first + i)
                    except TransferError as exc:  # the puller recomputes, or fails its request
                        log.warning("KV transfer %s: %s", transfer_id, exc)
                        await say({"error": exc.reason, "message": str(exc)})
                        return
                lag_s = starts_at + (i + 1) * link.s_per_block - time.monotonic()
                if lag_s > PACE_S:
                    await asyncio.sleep(lag_s)  # each block crosses the timed link in its time
                await say({"index": first + i, "hash": block_hash}, data)
                num_sent += 1
        finally:  # counted once per pull, not per block
            self.metrics.blocks_sent.inc(num_sent)
            self.metrics.bytes_sent.inc(num_sent * self._identity.block_bytes)

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
