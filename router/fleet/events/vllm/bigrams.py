"""SGLang's bigram pages (EAGLE), filed under hashes of the tokens the router indexes.

Under EAGLE speculative decoding SGLang keys its radix tree by token pairs: a page
holds positions ``s`` to ``s + B - 1`` and is reused only when the next token, ``s +
B``, matches too. Two pages whose positions hold the same tokens but whose next
tokens differ are two nodes there, with two engine hashes, and one block here (the
index keys blocks by their own tokens). Filed under the engine's hashes, the second
would be refused as a conflict (``translate``) and its whole chain lost as orphans.

``BigramChains`` rewrites a bigram store's hashes into hashes of the chain's own
tokens: a root chain's from its adapter, salts and tokens, a later block's from its
parent's and its tokens. Pages that agree on their tokens then share one hash, which
the translator counts as two copies of one block (forwarding the first store and the
last removal), and their descendants chain under it. Removals name the engine's
hashes: each is mapped back here while any store of it stands. A parent this worker
never announced stays as it is (the translator skips the orphan).
"""

from __future__ import annotations

import dataclasses
import hashlib

from router.fleet.events.vllm.wire import BlocksRemoved, BlocksStored


class BigramChains:
    """One worker's engine hash -> (token hash, stores not yet removed) for its
    bigram pages; ``reset`` when the worker's entries are dropped."""

    def __init__(self) -> None:
        self._hashes: dict[str, tuple[str, int]] = {}

    def reset(self) -> None:
        """Forget every page."""
        self._hashes.clear()

    def stored(self, event: BlocksStored) -> BlocksStored:
        """``event`` with the hashes of its tokens (and its parent's, if known)."""
        parent = event.parent
        if parent is None:
            previous = "\0".join((event.lora_name or "", *event.salt_keys))
        else:
            known = self._hashes.get(parent)
            parent = previous = known[0] if known is not None else parent
        hashes = []
        size = event.block_size
        for i, engine_hash in enumerate(event.hashes):
            tokens = event.tokens[i * size:(i + 1) * size]
            previous = hashlib.sha256(f"{previous}|{tokens}".encode()).hexdigest()[:32]
            num_stores = self._hashes.get(engine_hash, ("", 0))[1]
            self._hashes[engine_hash] = (previous, num_stores + 1)
            hashes.append(previous)
        return dataclasses.replace(event, hashes=tuple(hashes), parent=parent)

    def removed(self, event: BlocksRemoved) -> BlocksRemoved:
        """``event`` naming the token hashes of the engine hashes it removes (a hash
        never stored as a bigram page stays as it is)."""
        if not self._hashes:
            return event
        hashes = []
        for engine_hash in event.hashes:
            known = self._hashes.get(engine_hash)
            if known is None:
                hashes.append(engine_hash)
                continue
            token_hash, num_stores = known
            if num_stores > 1:
                self._hashes[engine_hash] = (token_hash, num_stores - 1)
            else:
                del self._hashes[engine_hash]
            hashes.append(token_hash)
        return dataclasses.replace(event, hashes=tuple(hashes))
