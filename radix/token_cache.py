"""Token ids of repeated text prefixes, reused: exact, cheap when prompts repeat.

Prompts in this product repeat by design (chat histories, system prompts, RAG
documents). Hugging Face byte-level BPE splits text into pieces with a regex before
merging, and merges never cross a piece. A **safe cut** is a position ``c`` with
``text[c] == " "`` and ``text[c - 1]`` not whitespace: for GPT-2's, Llama 3's and
Qwen2's split regexes (and the digit splitter) no piece contains both ``c - 1`` and
``c`` (a piece holding a non-space character never extends over a following
space, and whitespace-only pieces cannot hold ``c - 1``), pieces left of ``c`` read
nothing right of it (the only lookahead, ``\\s+(?!\\S)``, looks one character past a
whitespace run, which ends before ``c - 1``), and matching restarts at ``c`` exactly
as it starts a fresh string. So ``encode(a + b) == encode(a) + encode(b)`` whenever
``len(a)`` is a safe cut of ``a + b``, given no normalizer and no added token that
holds whitespace or strips it. ``eligible`` checks those conditions on the
tokenizer's JSON; any other tokenizer gets ``NullTokenCache`` (plain encodes).

``PrefixTokenCache`` encodes a text as chunks cut at safe cuts about every
``chunk_chars`` characters (one ``encode_batch_fast`` call), so it knows the token
count at each cut, and keeps (text, cut table, ids) in a ``RadixTree`` over the
text's characters (4 bytes each, UTF-32). A new text walks the tree once; from the
longest cached text sharing its first ``m`` characters it reuses the ids up to the
last cut before ``m`` and encodes only the rest. Entries are scoped like the prefix
index (a tenant sees its own and ``PUBLIC`` ones: tokenizing speed must not tell a
tenant what another one sent) and guarded by a lock (the router tokenizes long prompts on worker threads; the
encoding itself runs outside the lock).

The budget (``max_chars``) bounds what is stored, not what was new: one unit is a
tree key character, a cached token id or a cut table slot (4 bytes each), and each
entry adds a fixed overhead for its objects. Every entry holds its text's whole id
list, so a long shared prefix with many short suffixes costs each entry its full
length. Least recently used leaves are evicted until the total is within budget.
"""

from __future__ import annotations

import bisect
import json
import threading
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from radix.gguf_tokenizer import SPLIT_REGEXES
from radix.tokenizer import PromptTokenizer
from radix.tree import PUBLIC, RadixTree, Scope

_SAFE_SPLITS = frozenset(SPLIT_REGEXES.values())


class TextEncoder(Protocol):
    """What prompt tokenization needs: ``PromptTokenizer``'s two encoders."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``."""
        ...

    def encode_chat(self, messages: Sequence[Mapping[str, Any]],
                    add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the rendered chat."""
        ...


@dataclass(frozen=True)
class CacheStats:
    """Characters of text asked for, and of those how many were reused from the cache."""

    num_chars: int
    num_reused_chars: int


# Units (4 bytes each) charged per entry for its objects: the tree node, a split head,
# the entry and its arrays' headers.
_ENTRY_OVERHEAD_UNITS = 256


@dataclass(frozen=True, slots=True)
class _Entry:
    """A cached text's ids and, per safe cut it was encoded at, the tokens before it."""

    cut_chars: array
    cut_tokens: array
    token_ids: array

    @property
    def num_units(self) -> int:
        """What this entry counts against the budget (module docstring)."""
        return len(self.token_ids) + len(self.cut_chars) + len(self.cut_tokens) + (
            _ENTRY_OVERHEAD_UNITS)


def eligible(tokenizer_json: str) -> bool:
    """True when safe cuts split this tokenizer's encodings exactly (module docstring)."""
    spec = json.loads(tokenizer_json)
    model = spec.get("model") or {}
    if spec.get("normalizer") is not None or model.get("type") != "BPE" or model.get("dropout"):
        return False
    for token in spec.get("added_tokens") or ():
        content = token.get("content", "")
        if token.get("lstrip") or token.get("rstrip") or token.get("single_word") or (
            any(ch.isspace() for ch in content)
        ):
            return False
    return _pre_tokenizer_splits_at_spaces(spec.get("pre_tokenizer"), bool(model.get("merges")))


def _pre_tokenizer_splits_at_spaces(pre: dict[str, Any] | None, has_merges: bool) -> bool:
    if pre is None:
        return not has_merges
    kind = pre.get("type")
    if kind == "ByteLevel":
        return not pre.get("add_prefix_space") and (pre.get("use_regex", True) or not has_merges)
    if kind != "Sequence":
        return False
    steps = pre.get("pretokenizers") or []
    if not steps or steps[-1].get("type") != "ByteLevel" or steps[-1].get("add_prefix_space"):
        return False
    splits_words = steps[-1].get("use_regex", True)
    for step in steps[:-1]:
        if step.get("type") == "Split":
            pattern = (step.get("pattern") or {}).get("Regex")
            if pattern not in _SAFE_SPLITS or step.get("behavior") != "Isolated":
                return False
            splits_words = True
        elif not (step.get("type") == "Digits" and step.get("individual_digits")):
            return False
    return splits_words or not has_merges


def safe_cuts(text: str, every_chars: int) -> list[int]:
    """Safe cuts of ``text``, the first one at or after each ``every_chars`` mark."""
    cuts: list[int] = []
    position = every_chars
    while position < len(text):
        cut = text.find(" ", position)
        while cut > 0 and text[cut - 1].isspace():
            cut = text.find(" ", cut + 1)
        if cut <= 0:
            break
        cuts.append(cut)
        position = cut + every_chars
    return cuts


class PrefixTokenCache:
    """Exact token ids of text, reusing cached prefixes (see the module docstring)."""

    def __init__(self, tokenizer: PromptTokenizer, max_chars: int = 4_000_000,
                 chunk_chars: int = 128) -> None:
        self._tokenizer = tokenizer
        self._max_chars = max_chars
        self._chunk_chars = chunk_chars
        self._tree: RadixTree[_Entry | None] = RadixTree(lambda entry, _: (None, entry))
        self._lock = threading.Lock()
        self._num_chars = 0
        self._num_reused_chars = 0
        self._num_units = 0
        raw = tokenizer.encode("x", add_special_tokens=False)
        full = tokenizer.encode("x", add_special_tokens=True)
        start = next((i for i in range(len(full)) if full[i : i + len(raw)] == raw), None)
        self._affixes = None if start is None else (full[:start], full[start + len(raw) :])

    def encode(self, text: str, scope: Scope, add_special_tokens: bool = True) -> list[int]:
        """``tokenizer.encode(text, add_special_tokens)``, reusing what ``scope`` (and
        ``PUBLIC``) cached."""
        if not text or (add_special_tokens and self._affixes is None):
            return self._tokenizer.encode(text, add_special_tokens)
        key = text.encode("utf-32-le")
        with self._lock:
            reused_chars, entry, index = self._lookup(key, scope)
        if entry is not None and index is None:
            ids = list(entry.token_ids)
        else:
            ids = self._encode_with(text, key, scope, entry, index)
        with self._lock:
            self._num_chars += len(text)
            self._num_reused_chars += reused_chars
        if not add_special_tokens:
            return ids
        head, tail = self._affixes  # type: ignore[misc]
        return [*head, *ids, *tail]

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], scope: Scope,
                    add_generation_prompt: bool = True) -> list[int]:
        """``tokenizer.encode_chat`` with the rendered text encoded through the cache."""
        return self._tokenizer.encode_chat(
            messages, add_generation_prompt,
            encode_text=lambda text: self.encode(text, scope, add_special_tokens=False),
        )

    def scoped(self, scope: Scope) -> TextEncoder:
        """A ``TextEncoder`` that encodes through this cache in ``scope``."""
        return _ScopedEncoder(self, scope)

    def stats(self) -> CacheStats:
        """Totals since start."""
        with self._lock:
            return CacheStats(self._num_chars, self._num_reused_chars)

    def num_stored_units(self) -> int:
        """Units held now (module docstring); never above ``max_chars`` between calls."""
        with self._lock:
            return self._num_units

    def check_invariants(self) -> None:
        """The tree is consistent, the entry units add up, and the total is in budget."""
        with self._lock:
            self._tree.check_invariants()
            assert _held_units(list(self._tree.iter_nodes())) == self._num_units
            assert self._num_units <= self._max_chars

    def _lookup(self, key: bytes, scope: Scope) -> tuple[int, _Entry | None, int | None]:
        """(characters reused, the entry to reuse, the index of its last usable cut);
        index None with an entry: the whole text is cached."""
        match = self._tree.match(key, scope)
        node = match.last_node
        if node is None:
            return 0, None, None
        if node.end == match.num_matched_tokens == len(key) // 4 and node.payload is not None:
            return len(key) // 4, node.payload, None
        entry = _entry_below(node, scope)
        if entry is None:
            return 0, None, None
        index = bisect.bisect_left(entry.cut_chars, match.num_matched_tokens) - 1
        if index < 0:
            return 0, None, None
        return entry.cut_chars[index], entry, index

    def _encode_with(self, text: str, key: bytes, scope: Scope, entry: _Entry | None,
                     index: int | None) -> list[int]:
        start, cut_chars, cut_tokens, ids = 0, array("i"), array("i"), []
        if entry is not None and index is not None:
            start = entry.cut_chars[index]
            cut_chars = entry.cut_chars[: index + 1]
            cut_tokens = entry.cut_tokens[: index + 1]
            ids = list(entry.token_ids[: entry.cut_tokens[index]])
        cuts = [start, *(start + c for c in safe_cuts(text[start:], self._chunk_chars))]
        pieces = [text[a:b] for a, b in zip(cuts, [*cuts[1:], len(text)], strict=True)]
        for position, piece_ids in zip(cuts, self._tokenizer.encode_batch(pieces), strict=True):
            if position:
                cut_chars.append(position)
                cut_tokens.append(len(ids))
            ids += piece_ids
        with self._lock:
            self._store(key, scope, _Entry(cut_chars, cut_tokens, array("i", ids)))
        return ids

    def _store(self, key: bytes, scope: Scope, entry: _Entry) -> None:
        """Keep ``entry`` for ``key``, then evict LRU leaves until within budget (the
        new entry too, if it alone is over). Caller holds the lock."""
        inserted = self._tree.insert(key, scope)
        node = inserted.nodes[-1]
        replaced = node.payload.num_units if node.payload is not None else 0
        node.payload = entry
        self._num_units += sum(n.num_tokens for n in inserted.new_nodes) + entry.num_units - (
            replaced)
        while self._num_units > self._max_chars:
            evicted = self._tree.evict(1)
            if not evicted:
                break
            self._num_units -= _held_units(evicted)


def _held_units(nodes: Sequence[Any]) -> int:
    """Units ``nodes`` hold: their key characters and their entries."""
    return sum(n.num_tokens + (n.payload.num_units if n.payload else 0) for n in nodes)


def _entry_below(node: Any, scope: Scope) -> _Entry | None:
    """An entry at or below ``node`` visible to ``scope`` (each shares ``node``'s path)."""
    while node.payload is None and node.children:
        visible = [c for (s, _), c in node.children.items() if s in (scope, PUBLIC)]
        if not visible:
            return None
        node = visible[0]
    return node.payload


class _ScopedEncoder:
    """``PrefixTokenCache`` bound to one scope, shaped as a ``TextEncoder``."""

    def __init__(self, cache: PrefixTokenCache, scope: Scope) -> None:
        self._cache = cache
        self._scope = scope

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """See ``PrefixTokenCache.encode``."""
        return self._cache.encode(text, self._scope, add_special_tokens)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]],
                    add_generation_prompt: bool = True) -> list[int]:
        """See ``PrefixTokenCache.encode_chat``."""
        return self._cache.encode_chat(messages, self._scope, add_generation_prompt)


class NullTokenCache:
    """The cache for tokenizers that safe cuts do not split exactly: plain encodes."""

    def __init__(self, tokenizer: PromptTokenizer) -> None:
        self._tokenizer = tokenizer

    def scoped(self, scope: Scope) -> TextEncoder:
        """The tokenizer itself, in any scope."""
        return self._tokenizer

    def stats(self) -> CacheStats:
        """Nothing is ever reused."""
        return CacheStats(0, 0)


def token_cache(tokenizer: PromptTokenizer, max_chars: int) -> PrefixTokenCache | NullTokenCache:
    """A prefix cache for ``tokenizer`` if it is eligible (and ``max_chars`` > 0), else
    the null cache."""
    if max_chars > 0 and eligible(tokenizer.tokenizer_json):
        return PrefixTokenCache(tokenizer, max_chars)
    return NullTokenCache(tokenizer)

