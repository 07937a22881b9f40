"""A router-side consumer of ``GET /kv/events`` for tests: reads the NDJSON stream on a
thread, checks the protocol (gapless ``seq`` outside snapshots, known parents, chained
hashes) and keeps ``hash -> (parent, tokens, scope)``; ``tree()`` replays the known
blocks into a fresh RadixTree."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from collections.abc import Callable

from radix.hashing import BlockHasher
from radix.keys import from_key, to_key
from radix.tree import RadixTree
from tests.support.polling import wait_until

BlockPath = tuple[str, tuple[int, ...]]  # (scope of the last block, path tokens)


class Replay:
    """What one consumer knows about one worker's cache."""

    def __init__(self, namespace_digest: str, block_size: int) -> None:
        self.hasher = BlockHasher(bytes.fromhex(namespace_digest))
        self.block_size = block_size
        self.blocks: dict[str, tuple[str | None, tuple[int, ...], str]] = {}
        self.epoch: str | None = None
        self.last_seq: int | None = None
        self.snapshot_seq: int | None = None
        self.num_snapshots = 0

    def apply(self, event: dict) -> None:
        """Apply one event line (a snapshot starts with ``cleared``)."""
        seq = event["seq"]
        if event["type"] == "cleared":
            self.blocks.clear()
            self.epoch, self.snapshot_seq = event["epoch"], seq
            self.num_snapshots += 1
        elif seq != self.snapshot_seq:
            assert seq == self.last_seq + 1, f"gap: {self.last_seq} -> {seq}"
            self.snapshot_seq = None
        self.last_seq = seq
        for block in event["blocks"]:
            if event["type"] == "removed":
                self.blocks.pop(block["hash"], None)
                continue
            parent, tokens, scope = block["parent"], tuple(block["tokens"]), event["scope"]
            assert parent is None or len(self.blocks[parent][1]) == self.block_size
            chain = self.hasher.root_hash(scope) if parent is None else bytes.fromhex(parent)
            assert block["hash"] == self.hasher.block_hash(chain, scope, to_key(tokens)).hex()
            self.blocks[block["hash"]] = (parent, tokens, scope)

    def paths(self) -> set[BlockPath]:
        """Every known block as (its scope, the tokens of its whole path)."""
        out: set[BlockPath] = set()
        for parent, tokens, scope in self.blocks.values():
            parts = [tokens]
            while parent is not None:
                parent, above, _ = self.blocks[parent]
                parts.append(above)
            out.add((scope, sum(reversed(parts), ())))
        return out

    def tree(self) -> RadixTree:
        """A fresh RadixTree with every known path inserted under its scope."""
        tree: RadixTree = RadixTree()
        for scope, tokens in sorted(self.paths(), key=lambda path: len(path[1])):
            tree.insert(to_key(tokens), scope)
        return tree


def tree_paths(tree: RadixTree) -> set[tuple[str, tuple[int, ...]]]:
    """(scope, tokens) of every root-to-leaf path of ``tree``."""
    return {(node.scope, tuple(from_key(tree.path_key(node)))) for node in tree.iter_nodes()
            if node.is_leaf()}


class EventStream:
    """``GET /kv/events`` read line by line on a daemon thread into a ``Replay``."""

    def __init__(self, url: str, replay: Replay, since: int | None = None, epoch: str | None = None):
        self.replay = replay
        self.lines: list[dict | None] = []  # None marks a heartbeat
        self.lock = threading.Lock()
        parsed = urllib.parse.urlparse(url)
        query = {} if since is None else {"since": since, "epoch": epoch or ""}
        self._conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
        self._conn.request("GET", "/kv/events?" + urllib.parse.urlencode(query))
        self._response = self._conn.getresponse()
        assert self._response.status == 200
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for raw in self._response:
                line = raw.strip()
                event = json.loads(line) if line else None
                with self.lock:
                    if event is not None:
                        self.replay.apply(event)
                    self.lines.append(event)
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            return  # closed under a blocked read (http.client then raises AttributeError)

    def wait_for(self, predicate: Callable[[EventStream], bool], timeout_s: float = 10.0) -> None:
        """Block until ``predicate(self)`` holds (checked under the lock)."""
        def holds() -> bool:
            with self.lock:
                return predicate(self)

        wait_until(holds, timeout_s, "the KV event stream", interval_s=0.02)

    def close(self) -> None:
        """Drop the connection."""
        self._conn.close()
