"""Where a byte-level BPE encoding may be cut: the input bytes each token id stands for.

A ``ByteLevel`` pre-tokenizer turns every input byte into one character of GPT-2's
byte alphabet before the model merges anything, so a vocabulary token spelled in that
alphabet stands for exactly ``len(token)`` input bytes, and an added token (matched in
the raw text; ``radix.token_cache.eligible`` has ruled out normalizers and stripping)
for its content's UTF-8 bytes. Summing them over an encoding gives the byte offset
of every boundary between its tokens: ``TokenSpans.tokens_before`` finds how many ids
cover a given prefix. It takes the length of the text the ids encode and answers
None unless the ids stand for all of it: a BPE without a token for some byte (and no
unknown token) drops that byte, and every offset after it would be off. An offset
inside a token gives None too, never a guess; a vocabulary entry outside the
alphabet (which no input can produce) counts as longer than any text.
"""

from __future__ import annotations

import bisect
import functools
import json
from collections.abc import Sequence
from itertools import accumulate

from radix.tokenizer import byte_alphabet

_UNREACHABLE = 1 << 40


class TokenSpans:
    """Input bytes per token id of one byte-level tokenizer (module docstring)."""

    def __init__(self, num_bytes: Sequence[int]) -> None:
        self._num_bytes = list(num_bytes)

    @classmethod
    def of(cls, tokenizer_json: str) -> TokenSpans | None:
        """The spans of a tokenizer whose pre-tokenizer ends in ``ByteLevel``; None for
        any other. Built once per tokenizer file (they are read-only)."""
        return _spans_of(tokenizer_json)

    def tokens_before(self, token_ids: Sequence[int], num_text_bytes: int,
                      num_bytes: int) -> int | None:
        """How many leading ids of an encoding of ``num_text_bytes`` bytes stand for
        exactly its first ``num_bytes``; None when the ids do not stand for all of the
        text or the offset falls inside a token."""
        ends = list(accumulate(map(self._num_bytes.__getitem__, token_ids)))
        if (ends[-1] if ends else 0) != num_text_bytes:
            return None
        if num_bytes == 0:
            return 0
        at = bisect.bisect_left(ends, num_bytes)
        return at + 1 if at < len(ends) and ends[at] == num_bytes else None


@functools.lru_cache(maxsize=16)
def _spans_of(tokenizer_json: str) -> TokenSpans | None:
    spec = json.loads(tokenizer_json)
    pre = spec.get("pre_tokenizer") or {}
    steps = (pre.get("pretokenizers") or []) if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1].get("type") != "ByteLevel":
        return None
    alphabet = set(byte_alphabet())
    vocab = (spec.get("model") or {}).get("vocab") or {}
    added = {token["id"]: token["content"] for token in spec.get("added_tokens") or ()}
    size = max([-1, *vocab.values(), *added]) + 1
    num_bytes = [_UNREACHABLE] * size
    for token, token_id in vocab.items():
        if all(char in alphabet for char in token):
            num_bytes[token_id] = len(token)
    for token_id, content in added.items():
        num_bytes[token_id] = len(content.encode("utf-8", "surrogatepass"))
    return TokenSpans(num_bytes)
