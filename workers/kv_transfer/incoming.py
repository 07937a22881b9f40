"""``Incoming``: the blocks of one pull into this worker as they arrive, for a relay.

A worker still receiving a prefix can already send it on: its producer serves a
hold's blocks that are on their way here from this record, each once it has arrived
(its bytes were checked against its index, hash and size and authenticated under the
puller's nonce before they were added), so a prefix spreads over a fleet in about one
link time instead of one per hop (docs/pd.md, "Relays"). The record lives on the loop
thread; the blocks stay in memory while a relay hold references it, never longer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from workers.kv_transfer.wire import TransferError


class Signal:
    """Wakes every task waiting on it at once; a wait begun after a ``fire`` waits for
    the next one."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    async def wait(self) -> None:
        """Until the next ``fire``."""
        await self._event.wait()

    def fire(self) -> None:
        """Wake every waiting task."""
        self._event.set()
        self._event = asyncio.Event()


class Incoming:
    """The blocks ``first..`` of the chain ``hashes`` (the prompt's block hashes from
    block 0) for ``scope``, as a pull receives them; ``broken`` once the pull stopped
    before the last one arrived."""

    def __init__(self, scope: str, hashes: Sequence[str], first: int) -> None:
        self.scope = scope
        self.hashes = tuple(hashes)
        self.first = first
        self.blocks: list[bytes] = []
        self.broken: str | None = None
        self._changed = Signal()

    def covers(self, scope: str, hashes: Sequence[str]) -> bool:
        """Whether this pull brings the last of ``hashes`` (a chain from block 0, so
        every block before it too) for ``scope``."""
        n = len(hashes)
        return (scope == self.scope and 0 < n <= len(self.hashes)
                and self.hashes[n - 1] == hashes[n - 1] and self.broken is None)

    @property
    def complete(self) -> bool:
        """Every block has arrived."""
        return self.first + len(self.blocks) == len(self.hashes)

    def add(self, data: bytes) -> None:
        """The next block arrived (checked)."""
        self.blocks.append(data)
        self._changed.fire()

    def stop(self, reason: str) -> None:
        """The pull ended; unless every block arrived, it is broken for ``reason``."""
        if not self.complete and self.broken is None:
            self.broken = reason
        self._changed.fire()

    async def block(self, index: int) -> bytes:
        """Block ``index`` of the chain (at least ``first``), once it has arrived;
        TransferError ``protocol`` if the pull broke off before it."""
        while (k := index - self.first) >= len(self.blocks):
            if self.broken is not None:
                raise TransferError("protocol", f"the pull relayed here broke off before "
                                                f"block {index} ({self.broken})")
            await self._changed.wait()
        return self.blocks[k]
