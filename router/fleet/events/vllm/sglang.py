"""What SGLang's KV events carry beyond vLLM's format, read for ``wire``.

SGLang's publisher (``sglang/srt/disaggregation/kv_events.py``, ``ZmqEventPublisher``)
is vLLM's: the same PUB and ROUTER sockets, frames, sequence numbers, replay and end
marker, the same ``[ts, [events], attn_dp_rank]`` batch and the same three event names.
What its ``BlockStored`` adds, by release (docs/sglang.md has the table):

- **The salt.** Up to 0.5.17 a store carries none. 0.5.18 and 0.5.19 encode events as
  tagged arrays and append a ``metadata`` map ``{"cache_salt": ...}`` to a salted store,
  at the position where vLLM's array has ``lora_name``; 0.5.20 on encode tagged maps
  with a ``cache_salt`` field. Either is one of the store's salt strings here (vLLM
  puts its salt in ``extra_keys``, which ``wire`` reads).
- **Bigram pages.** Under EAGLE speculative decoding SGLang keys its radix tree by
  token pairs, and a store's ``token_ids`` are ``[token, next token]`` pairs, one per
  position. The position's own token is the first of each pair: those are the tokens
  the router indexes (``bigrams`` files them; docs/sglang.md says what that
  over-claims).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_METADATA = "metadata"
_IN_PLACE_OF = "lora_name"


def array_fields(names: Sequence[str], values: Sequence[Any]) -> dict[str, Any]:
    """A tagged array's fields under vLLM's ``names``; a map where vLLM has
    ``lora_name`` (a string) is SGLang's ``metadata`` and is filed under that name."""
    fields = dict(zip(names, values, strict=False))
    if isinstance(fields.get(_IN_PLACE_OF), Mapping):
        fields[_METADATA] = fields.pop(_IN_PLACE_OF)
    return fields


def salt_strings(fields: Mapping[str, Any]) -> tuple[str, ...]:
    """The salts an SGLang store names: its ``cache_salt`` field (0.5.20 on) or its
    ``metadata`` map's (0.5.18, 0.5.19); empty for a vLLM store."""
    metadata = fields.get(_METADATA)
    candidates = (fields.get("cache_salt"),
                  metadata.get("cache_salt") if isinstance(metadata, Mapping) else None)
    return tuple(salt for salt in candidates if isinstance(salt, str) and salt)


def is_bigram(token_ids: object) -> bool:
    """Whether a store's ``token_ids`` are bigram pages (lists, not token ids)."""
    return isinstance(token_ids, list) and bool(token_ids) and isinstance(token_ids[0], list)


def first_tokens(pairs: list[Any]) -> list[Any] | None:
    """Each bigram pair's first token (the position's own); None for pairs that are
    not two-element lists or do not chain (each pair's second token is the next
    pair's first)."""
    if not all(isinstance(pair, list) and len(pair) == 2 for pair in pairs):
        return None
    if any(a[1] != b[0] for a, b in zip(pairs, pairs[1:], strict=False)):
        return None
    return [pair[0] for pair in pairs]
