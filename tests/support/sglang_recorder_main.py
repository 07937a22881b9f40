"""SGLang's own KV event code, driven over stdin: run by ``.sglang/venv``'s Python
(``make sglang``), never imported by the project or the tests.

Usage: ``python sglang_recorder_main.py EVENTS REPLAY PAGE_SIZE BIGRAM(0|1)``.

It runs SGLang's ``ZmqEventPublisher`` and event structs
(``sglang/srt/disaggregation/kv_events.py``) and its ``KVCacheEventRecorder``
(``sglang/srt/mem_cache/events.py``: one store per page, chains coalesced, parents,
salts, adapter names, bigram pages), loaded without SGLang's package ``__init__``
files, which import torch: ``sglang``, ``sglang.srt.utils`` and
``sglang.srt.mem_cache`` are bare packages here. Two stand-ins remain:
``sglang.srt.mem_cache.utils`` (the page hash functions, which need SGLang's native
extension: here chained SHA-256 over each page, salted as SGLang salts, cut to int64
as SGLang cuts them) and the radix tree (``Tree``: SGLang's insert with node splits
that keep each page's hash, leaf eviction and reset, with the fields the recorder
reads). What the router sees, frames and payloads, is SGLang's.

Commands are JSON lines, each answered by one JSON line:
``{"op": "insert", "tokens": [...], "salt": str | null, "lora": str | null}``,
``{"op": "evict", "leaf": i}`` (the i-th leaf, modulo their number, oldest first),
``{"op": "clear"}``, and ``{"op": "publish"}``, which publishes what the recorder
took as one batch and answers ``{"seq": last seq or null, "nodes": [[salt, lora,
path tokens], ...]}`` (path tokens: each position's own token).
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

_ROOT = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])  # type: ignore[union-attr]
for _name, _sub in (("sglang", ""), ("sglang.srt.utils", "srt/utils"),
                    ("sglang.srt.mem_cache", "srt/mem_cache")):
    _package = types.ModuleType(_name)
    _package.__path__ = [str(_ROOT / _sub)]
    sys.modules[_name] = _package


def _chain(previous: str | None, items: list[Any]) -> str:
    return hashlib.sha256(f"{previous}|{items}".encode()).hexdigest()


def _page_hashes(node: Any, page_size: int, previous: str | None) -> list[str]:
    hashes = []
    for start in range(0, len(node.key), page_size):
        previous = _chain(previous, node.key.items(start, start + page_size))
        hashes.append(previous)
    return hashes


def compute_node_hash_values(node: Any, page_size: int) -> list[str]:
    """Each page's hash, chained from the parent's last page."""
    parent = node.parent
    if parent is not None and len(parent.key) and parent.hash_value is None:
        parent.hash_value = compute_node_hash_values(parent, page_size)
    previous = parent.hash_value[-1] if parent is not None and parent.hash_value else None
    return _page_hashes(node, page_size, previous)


def compute_node_event_hash_values(node: Any, page_size: int) -> list[str]:
    """Salted chains hash from a seed of their salt, as SGLang's do (kept on the node)."""
    if node.key.extra_key is None and node.key.cache_salt is None:
        return compute_node_hash_values(node, page_size)
    if node.event_hash_value is None:
        parent = node.parent
        if len(parent.key):
            previous = compute_node_event_hash_values(parent, page_size)[-1]
        else:
            previous = _chain(None, [node.key.cache_salt, node.key.extra_key])
        node.event_hash_value = _page_hashes(node, page_size, previous)
    return node.event_hash_value


def hash_str_to_int64(hash_str: str) -> int:
    """SGLang's cut: the first 64 bits, as a signed int."""
    value = int(hash_str[:16], 16)
    return value - 2**64 if value >= 2**63 else value


_utils = types.ModuleType("sglang.srt.mem_cache.utils")
_utils.compute_node_hash_values = compute_node_hash_values  # type: ignore[attr-defined]
_utils.compute_node_event_hash_values = compute_node_event_hash_values  # type: ignore[attr-defined]
_utils.hash_str_to_int64 = hash_str_to_int64  # type: ignore[attr-defined]
sys.modules["sglang.srt.mem_cache.utils"] = _utils

from sglang.srt.disaggregation.kv_events import KVEventBatch, ZmqEventPublisher  # noqa: E402
from sglang.srt.mem_cache.events import KVCacheEventRecorder  # noqa: E402


class Key:
    """SGLang's ``RadixKey`` as the recorder reads it: raw ``token_ids`` (one more
    than the positions when ``is_bigram``), ``extra_key`` (an adapter's id) and
    ``cache_salt``."""

    def __init__(self, token_ids: list[int], extra_key: str | None, cache_salt: str | None,
                 is_bigram: bool) -> None:
        self.token_ids = token_ids
        self.extra_key = extra_key
        self.cache_salt = cache_salt
        self.is_bigram = is_bigram

    def __len__(self) -> int:
        return max(len(self.token_ids) - 1, 0) if self.is_bigram else len(self.token_ids)

    def sub(self, start: int, stop: int) -> Key:
        """Positions ``start`` to ``stop`` (a bigram key keeps its next token)."""
        end = stop + 1 if self.is_bigram else stop
        return Key(self.token_ids[start:end], self.extra_key, self.cache_salt, self.is_bigram)

    def items(self, start: int, stop: int) -> list[Any]:
        """The positions' items: tokens, or (token, next token) pairs."""
        stop = min(stop, len(self))
        if self.is_bigram:
            return [(self.token_ids[j], self.token_ids[j + 1]) for j in range(start, stop)]
        return self.token_ids[start:stop]


class Node:
    """A radix tree node with the fields the recorder reads."""

    _ids = itertools.count()

    def __init__(self, key: Key, parent: Node | None, lora: str | None = None) -> None:
        self.id = next(self._ids)
        self.key = key
        self.parent = parent
        self.lora = lora
        self.children: dict[Any, Node] = {}
        self.hash_value: list[str] | None = None
        self.event_hash_value: list[str] | None = None

    def path_tokens(self) -> list[int]:
        """Each position's own token from the root to the end of this node."""
        node: Node | None = self
        parts: list[list[int]] = []
        while node is not None and node.parent is not None:
            parts.append([item[0] if node.key.is_bigram else item
                          for item in node.key.items(0, len(node.key))])
            node = node.parent
        return [token for part in reversed(parts) for token in part]


class Tree:
    """SGLang's radix tree insert (split keeping page hashes) and leaf eviction."""

    def __init__(self, recorder: KVCacheEventRecorder, page_size: int, bigram: bool) -> None:
        self.recorder = recorder
        self.page_size = page_size
        self.bigram = bigram
        self.root = Node(Key([], None, None, bigram), None)

    def child_key(self, key: Key) -> Any:
        return key.extra_key, key.cache_salt, tuple(key.items(0, self.page_size))

    def insert(self, tokens: list[int], salt: str | None, lora: str | None) -> None:
        extra_key = None if lora is None else hashlib.md5(lora.encode()).hexdigest()
        if extra_key is not None:
            self.recorder.lora_names.register(
                types.SimpleNamespace(extra_key=extra_key, lora_id=extra_key), lora)
        key = Key(tokens, extra_key, salt, self.bigram)
        key = key.sub(0, len(key) // self.page_size * self.page_size)
        node = self.root
        while len(key) and (child := node.children.get(self.child_key(key))) is not None:
            matched = self._matched(child.key, key)
            if matched < len(child.key):
                child = self._split(child, matched)
            node, key = child, key.sub(matched, len(key))
        if len(key):
            new = Node(key, node, lora)
            node.children[self.child_key(key)] = new
            self.recorder.record_store(new)

    def _matched(self, a: Key, b: Key) -> int:
        size = self.page_size
        n = 0
        while n < min(len(a), len(b)) and a.items(n, n + size) == b.items(n, n + size):
            n += size
        return n

    def _split(self, child: Node, matched: int) -> Node:
        parent = child.parent
        assert parent is not None
        new = Node(child.key.sub(0, matched), parent, child.lora)
        pages = matched // self.page_size
        for name in ("hash_value", "event_hash_value"):
            hashes = getattr(child, name)
            if hashes is not None:
                setattr(new, name, hashes[:pages])
                setattr(child, name, hashes[pages:])
        parent.children[self.child_key(child.key)] = new
        child.key = child.key.sub(matched, len(child.key))
        child.parent = new
        new.children[self.child_key(child.key)] = child
        return new

    def nodes(self) -> list[Node]:
        found, pending = [], list(self.root.children.values())
        while pending:
            node = pending.pop()
            found.append(node)
            pending += node.children.values()
        return sorted(found, key=lambda n: n.id)

    def evict(self, index: int) -> None:
        leaves = [n for n in self.nodes() if not n.children]
        if leaves:
            leaf = leaves[index % len(leaves)]
            assert leaf.parent is not None
            del leaf.parent.children[self.child_key(leaf.key)]
            self.recorder.record_remove(leaf)

    def clear(self) -> None:
        self.root.children.clear()
        self.recorder.record_all_cleared()


def main() -> None:
    events, replay, page_size, bigram = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    publisher = ZmqEventPublisher(0, endpoint=events, replay_endpoint=replay)
    recorder = KVCacheEventRecorder(enabled=True, page_size=page_size)
    tree = Tree(recorder, page_size, bigram == "1")
    seq = None
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        answer: dict[str, Any] = {}
        if op == "insert":
            tree.insert(command["tokens"], command.get("salt"), command.get("lora"))
        elif op == "evict":
            tree.evict(command["leaf"])
        elif op == "clear":
            tree.clear()
        elif op == "publish":
            taken = recorder.take()
            if taken:
                publisher.publish(KVEventBatch(ts=time.time(), events=taken))
                seq = 0 if seq is None else seq + 1
            answer = {"seq": seq, "nodes": [[n.key.cache_salt, n.lora, n.path_tokens()]
                                             for n in tree.nodes()]}
        print(json.dumps(answer), flush=True)
    publisher.shutdown()


if __name__ == "__main__":
    main()
