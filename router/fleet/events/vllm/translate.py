"""vLLM's KV events of one worker, as the router index's own ``KVEvent``s.

What vLLM says and what the index needs differ in four ways, each settled here:

- **Tenant.** vLLM knows no tenants; it mixes the request's ``cache_salt`` into the
  first block's hash and publishes it in that block's extra keys. The router issued
  every salt (``radix.openai.salt``), so a salt it knows maps back to its tenant's
  scope; later blocks of the chain inherit their parent's scope. A chain whose salt
  the router does not know (a client that reached vLLM directly) is credited to no
  tenant: it is never indexed.
- **Adapter.** ``lora_name`` selects the adapter's namespace
  (``namespace_for(lora_name)``); None is the base model's.
- **Tier.** ``medium`` ``"GPU"`` (or none) is the device; anything else (``"CPU"``,
  storage) is the host tier, which the index weighs below a device hit.
- **Duplicates.** vLLM can hold two physical blocks with one hash (two requests
  computed the same block in one step) and publishes a store and, later, a removal
  for each. A per-hash reference count forwards the first store and the last removal
  only, so one eviction does not drop a block the engine still holds.
- **Orphans.** vLLM reuses only a contiguous chain from the first block. Its LRU frees
  a request's blocks tail first, so a parent normally outlives its children; when a
  parent goes first anyway, its descendants are dropped from the index with it (an
  under-claim until they are stored again, never a claim of an unreachable block).
- **Bigram pages** (SGLang under EAGLE) are filed under hashes of their own tokens
  (``bigrams``): two engine pages with the same tokens are two copies of one block.
- **Conflicts.** A block is one place in the index: its tier, namespace, scope, parent
  and tokens. A stored block whose place this worker already holds under another
  engine hash (vLLM sends none for what the router sent: every hash input it mixes in
  is the router's) is a ``BlockConflict``: the whole event is refused before anything
  changes, so the index never files one block under two hashes.

Only full-attention KV groups are indexed: the first group whose spec kind is
``full_attention`` (or unnamed, before vLLM published kinds). A sliding-window group
keeps only its last window of blocks, so a prefix hit there needs every block of the
window, not the longest chain: a different match rule (docs/protocol.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from radix.events import EventBlock, KVEvent, Medium
from radix.keys import to_key
from router.fleet.events.vllm.bigrams import BigramChains
from router.fleet.events.vllm.wire import (
    AllCleared,
    BlocksRemoved,
    BlocksStored,
    Event,
    WireError,
)

FULL_ATTENTION = "full_attention"
DEVICE_MEDIA = (None, "GPU", "gpu", "device")
# (tier, namespace, scope, parent hash, tokens as an index key): one block of the index
_Place = tuple[Medium, str, str, str | None, bytes]


class BlockConflict(WireError):
    """A stored block whose place (``_Place``) the worker already holds under another
    engine hash."""


@dataclass(slots=True)
class _Entry:
    """One engine block hash the index holds: where it is filed, its place and how
    many physical copies the engine reported."""

    namespace: str
    scope: str
    num_copies: int
    place: _Place
    children: list[str] | None = None


class VllmTranslator:
    """Turns one worker's vLLM events into ``KVEvent``s for ``RouterIndex.apply_event``.

    ``scope_of_salt`` maps a ``cache_salt`` to the tenant scope it was issued for
    (None: not the router's); ``namespace_for`` maps a ``lora_name`` (None: the base
    model) to the router's namespace digest. State is per worker: ``reset`` after the
    index dropped the worker's entries.
    """

    def __init__(self, worker_id: str, scope_of_salt: Callable[[str], str | None],
                 namespace_for: Callable[[str | None], str]) -> None:
        self.worker_id = worker_id
        self._scope_of_salt = scope_of_salt
        self._namespace_for = namespace_for
        self._entries: dict[tuple[Medium, str], _Entry] = {}
        self._holders: dict[_Place, str] = {}
        self._group: int | None = None
        self._bigrams = BigramChains()
        self.num_unknown_salt_blocks = 0
        self.num_skipped_group_events = 0

    def reset(self) -> None:
        """Forget every block (the index forgot them too)."""
        self._entries.clear()
        self._holders.clear()
        self._group = None
        self._bigrams.reset()

    def translate(self, seq: int, event: Event) -> list[KVEvent]:
        """The index events for ``event``, in order (none when there is nothing to
        apply); ``BlockConflict``, with nothing changed, for a store that conflicts."""
        if isinstance(event, AllCleared):
            self.reset()
            return [self._event(seq, "cleared", "", "", (), "device")]
        if not self._indexed_group(event):
            self.num_skipped_group_events += 1
            return []
        if isinstance(event, BlocksStored):
            stored = self._stored(seq, self._bigrams.stored(event) if event.bigram else event)
            return [] if stored is None else [stored]
        return self._removed(seq, self._bigrams.removed(event))

    def _indexed_group(self, event: BlocksStored | BlocksRemoved) -> bool:
        if event.group_idx is None:
            return True
        if isinstance(event, BlocksStored) and self._group is None and (
                event.spec_kind in (None, FULL_ATTENTION)):
            self._group = event.group_idx
        return event.group_idx == self._group

    def _stored(self, seq: int, event: BlocksStored) -> KVEvent | None:
        medium = _medium(event.medium)
        place = self._place(event, medium)
        if place is None:
            self.num_unknown_salt_blocks += len(event.hashes)
            return None
        namespace, scope = place
        size = event.block_size
        keys = [to_key(event.tokens[i * size:(i + 1) * size]) for i in range(len(event.hashes))]
        self._check_conflicts(medium, namespace, scope, event, keys)
        blocks = []
        parent = event.parent
        for block_hash, key in zip(event.hashes, keys, strict=True):
            entry = self._entries.get((medium, block_hash))
            if entry is not None:
                entry.num_copies += 1
            else:
                spot = (medium, namespace, scope, parent, key)
                self._entries[(medium, block_hash)] = _Entry(namespace, scope, 1, spot)
                self._holders[spot] = block_hash
                blocks.append(EventBlock(block_hash, parent, key))
                if parent is not None:
                    self._link(medium, parent, block_hash)
            parent = block_hash
        if not blocks:
            return None
        return self._event(seq, "stored", namespace, scope, tuple(blocks), medium)

    def _check_conflicts(self, medium: Medium, namespace: str, scope: str,
                         event: BlocksStored, keys: list[bytes]) -> None:
        """``BlockConflict`` if a new block of ``event`` takes a place another hash holds."""
        parent = event.parent
        for block_hash, key in zip(event.hashes, keys, strict=True):
            if (medium, block_hash) not in self._entries:
                holder = self._holders.get((medium, namespace, scope, parent, key))
                if holder is not None and holder != block_hash:
                    raise BlockConflict(f"block {block_hash} takes the place of block {holder}")
            parent = block_hash

    def _parent(self, medium: Medium, parent: str) -> _Entry | None:
        """A parent block: in the same tier, or on the device (host blocks continue
        device chains)."""
        return self._entries.get((medium, parent)) or self._entries.get(("device", parent))

    def _link(self, medium: Medium, parent: str, child: str) -> None:
        entry = self._parent(medium, parent)
        if entry is not None:
            if entry.children is None:
                entry.children = []
            entry.children.append(child)

    def _place(self, event: BlocksStored, medium: Medium) -> tuple[str, str] | None:
        """(namespace, scope) of a stored chain: its parent's, or from its salt."""
        if event.parent is not None:
            parent = self._parent(medium, event.parent)
            return None if parent is None else (parent.namespace, parent.scope)
        for key in event.salt_keys:
            scope = self._scope_of_salt(key)
            if scope is not None:
                return self._namespace_for(event.lora_name), scope
        return None

    def _removed(self, seq: int, event: BlocksRemoved) -> list[KVEvent]:
        """The blocks whose last copy left, and their descendants: one event per
        namespace and scope they were filed under (an engine may remove blocks of
        several tenants and adapters in one event; SGLang coalesces its removals)."""
        medium = _medium(event.medium)
        gone: dict[tuple[str, str], list[str]] = {}
        for block_hash in event.hashes:
            entry = self._entries.get((medium, block_hash))
            if entry is None:
                continue
            entry.num_copies -= 1
            if entry.num_copies == 0:
                self._drop_subtree(medium, block_hash,
                                   gone.setdefault((entry.namespace, entry.scope), []))
        return [self._event(seq, "removed", namespace, scope,
                            tuple(EventBlock(block_hash) for block_hash in hashes), medium)
                for (namespace, scope), hashes in gone.items()]

    def _drop_subtree(self, medium: Medium, root: str, gone: list[str]) -> None:
        """Forget ``root`` and every block chained below it (children before parents,
        the order the index removes in)."""
        pending = [root]
        dropped: list[str] = []
        while pending:
            block_hash = pending.pop()
            entry = self._entries.pop((medium, block_hash), None)
            if entry is None:
                continue
            if self._holders.get(entry.place) == block_hash:
                del self._holders[entry.place]
            dropped.append(block_hash)
            pending += entry.children or ()
        gone += reversed(dropped)

    def _event(self, seq: int, kind: str, namespace: str, scope: str,
               blocks: tuple[EventBlock, ...], medium: Medium) -> KVEvent:
        return KVEvent(worker=self.worker_id, epoch="vllm", seq=seq, type=kind,  # type: ignore[arg-type]
                       namespace=namespace or "-", scope=scope or "-", blocks=blocks,
                       medium=medium)

    def num_blocks(self) -> Mapping[Medium, int]:
        """Blocks held per medium (for status and tests)."""
        counts: dict[Medium, int] = {}
        for medium, _ in self._entries:
            counts[medium] = counts.get(medium, 0) + 1
        return counts


def _medium(name: str | None) -> Medium:
    return "device" if name in DEVICE_MEDIA else "host"
