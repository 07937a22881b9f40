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

``PrefixTokenCache`` cuts a text into chunks at the first safe cut after every
``chunk_chars`` characters (a chunk's bounds depend only on the text before them, so
two texts sharing a prefix share its chunks) and keeps each chunk's ids as a link of a
hash chain (``radix.chain_cache``: the digest of chunk ``k`` covers chunks ``0..k``).
A new text hashes its chunks (C speed), looks the chain up one dict lookup per chunk,
compares each found chunk's text with its own, and encodes only from the first chunk
not held: Python work per chunk, not per character. Within that chunk it also reuses
the ids of the newest chunk cached after the same prefix up to the last safe cut both
share (a repeated document followed by a new question, a conversation's last turn
followed by the next), counting token bytes with ``radix.token_spans``; the new
chunks are encoded in one ``encode_batch`` call. Entries are scoped like the prefix index (a tenant
sees its own and ``PUBLIC`` ones: tokenizing speed must not tell a tenant what
another one sent). Chats are rendered through ``radix.chat_render`` (only a
conversation's new messages, where the template allows it), whose links share this
cache's chain store and budget.

The budget (``max_chars``) bounds what is stored, not what was new: one unit is a
character of a cached chunk or rendered message, a cached token id or a message
character (4 bytes each), and each link adds a fixed overhead for its objects. A
text's chunks are shared by every text that starts with them. Least recently used
links are evicted, deepest first, until the total is within budget.
"""

from __future__ import annotations

import json
import threading
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from radix.chain_cache import ChainCache, chain_digests
from radix.chat_render import ChatRenderCache
from radix.gguf_tokenizer import SPLIT_REGEXES
from radix.token_spans import TokenSpans
from radix.tokenizer import PromptTokenizer
from radix.tree import Scope

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
    """Characters of text asked for, and of those how many were reused from the cache;
    chat messages asked for, and of those how many were reused already rendered."""

    num_chars: int
    num_reused_chars: int
    num_messages: int = 0
    num_reused_messages: int = 0


# Units (4 bytes each) charged per cached chunk for its objects: the link, its key,
# the chunk and its text's and array's headers.
_CHUNK_OVERHEAD_UNITS = 128
_SEED = 0


class _Chunk(NamedTuple):
    """Text between two safe cuts (or a cut and the end) and its ids, ``encode(text)``."""

    text: str
    token_ids: array


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
                 chunk_chars: int = 256) -> None:
        self._tokenizer = tokenizer
        self._chunk_chars = chunk_chars
        self._links: ChainCache[Any] = ChainCache(max_chars)
        self._spans = TokenSpans.of(tokenizer.tokenizer_json)
        self._chats = ChatRenderCache(tokenizer, self._links)
        self._lock = threading.Lock()
        self._num_chars = 0
        self._num_reused_chars = 0
        raw = tokenizer.encode("x", add_special_tokens=False)
        full = tokenizer.encode("x", add_special_tokens=True)
        start = next((i for i in range(len(full)) if full[i : i + len(raw)] == raw), None)
        self._affixes = None if start is None else (full[:start], full[start + len(raw) :])

    def encode(self, text: str, scope: Scope, add_special_tokens: bool = True) -> list[int]:
        """``tokenizer.encode(text, add_special_tokens)``, reusing what ``scope`` (and
        ``PUBLIC``) cached."""
        if not text or (add_special_tokens and self._affixes is None):
            return self._tokenizer.encode(text, add_special_tokens)
        ids = self._cached_ids(text, scope)
        if not add_special_tokens:
            return ids
        head, tail = self._affixes  # type: ignore[misc]
        return [*head, *ids, *tail]

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], scope: Scope,
                    add_generation_prompt: bool = True) -> list[int]:
        """``tokenizer.encode_chat``: rendered through the chat render cache where the
        template allows it (``radix.chat_render``), the text encoded through this cache."""
        text = self._chats.render(messages, scope, add_generation_prompt)
        if text is not None:
            return self.encode(text, scope, add_special_tokens=False)
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
            return CacheStats(self._num_chars, self._num_reused_chars, *self._chats.stats())

    def num_stored_units(self) -> int:
        """Units held now (module docstring); never above ``max_chars`` between calls."""
        return self._links.num_units()

    def check_invariants(self) -> None:
        """The chain links are consistent and within budget (``ChainCache``)."""
        self._links.check_invariants()

    def _cached_ids(self, text: str, scope: Scope) -> list[int]:
        """Ids of ``text``: the chunks ``scope`` sees cached, the rest encoded and kept."""
        bounds = [0, *safe_cuts(text, self._chunk_chars), len(text)]
        pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        digests = chain_digests([p.encode("utf-8", "surrogatepass") for p in pieces], _SEED)
        ids = array("I")
        keys = []
        for (key, chunk), piece in zip(self._links.longest(scope, digests), pieces,
                                       strict=False):
            if not isinstance(chunk, _Chunk) or chunk.text != piece:
                break
            ids += chunk.token_ids
            keys.append(key)
        num_found = len(keys)
        num_reused = bounds[num_found]
        new = []
        if num_found < len(pieces):
            head_ids, num_head_chars = self._reuse_within(keys, pieces[num_found])
            runs = self._encode_runs(text, bounds[num_found:], num_head_chars)
            runs[0] = head_ids + runs[0]
            for digest, piece, run in zip(digests[num_found:], pieces[num_found:], runs,
                                          strict=True):
                ids += run
                new.append((digest, _Chunk(piece, run),
                            len(piece) + len(run) + _CHUNK_OVERHEAD_UNITS))
            num_reused += num_head_chars
        self._links.extend(scope, keys, new)
        with self._lock:
            self._num_chars += len(text)
            self._num_reused_chars += num_reused
        return ids.tolist()

    def _reuse_within(self, keys: Sequence[Any], piece: str) -> tuple[array, int]:
        """(ids, characters) of ``piece``'s longest prefix ending at a safe cut that the
        newest chunk cached after ``keys`` shares; nothing without spans or a chunk."""
        sibling = self._links.last_child(keys[-1]) if keys and self._spans else None
        if not isinstance(sibling, _Chunk):
            return array("I"), 0
        cut = _last_safe_cut(piece, _common_prefix_chars(piece, sibling.text))
        num_tokens = self._spans.tokens_before(  # type: ignore[union-attr]
            sibling.token_ids, _num_bytes(sibling.text), _num_bytes(piece[:cut]))
        if num_tokens is None:
            return array("I"), 0
        return sibling.token_ids[:num_tokens], cut

    def _encode_runs(self, text: str, bounds: Sequence[int], skip: int) -> list[array]:
        """The ids of each chunk between ``bounds``, the first without its leading
        ``skip`` characters, in one ``encode_batch`` call (Hugging Face's BPE encodes
        a text in chunks faster than whole)."""
        starts = [bounds[0] + skip, *bounds[1:-1]]
        texts = [text[a:b] for a, b in zip(starts, bounds[1:], strict=True)]
        return [array("I", run) for run in self._tokenizer.encode_batch(texts)]


def _num_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _common_prefix_chars(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share (a binary search of C compares)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a.startswith(b[low:middle], low):
            low = middle
        else:
            high = middle - 1
    return low


def _last_safe_cut(text: str, end: int) -> int:
    """The last safe cut ``c`` of ``text`` with ``0 < c < end``, else 0."""
    cut = text.rfind(" ", 1, end)
    while cut > 0 and text[cut - 1].isspace():
        cut = text.rfind(" ", 1, cut)
    return max(cut, 0)


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

