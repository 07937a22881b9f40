"""vLLM's KV event wire format, decoded tolerantly.

A vLLM (or SGLang) engine publishes its prefix cache's changes over ZMQ: each PUB
message is three frames, ``[topic, seq, payload]``, with ``seq`` an 8-byte
big-endian counter (gapless, starting at 0 in every process) and ``payload`` a
msgpack ``EventBatch``: ``[ts, [events], dp_rank]`` (``ts`` from ``time.time()``).

Events come in two encodings, both accepted here:

- a map tagged ``{"type": "BlockStored", "block_hashes": ..., ...}`` (vLLM >= 0.9);
- an array tagged ``["BlockStored", block_hashes, parent, ...]``, fields in
  declaration order, trailing defaults left out (older vLLM, SGLang).

What SGLang's stores add (a salt field, bigram pages) is read by ``sglang``.

Block hashes are uint64 ints (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``) or raw bytes;
both become one canonical hex string. Unknown fields and unknown event types are
ignored; an event of a known type whose fields do not fit is a ``WireError``, as is
a payload that is not a batch. Decoding never trusts a length: token ids are checked
against the block count and block size before anything uses them; a stored chain that
names a hash twice, or one of its own blocks as its parent, is a ``WireError`` too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from router.fleet.events.vllm.sglang import array_fields, first_tokens, is_bigram, salt_strings

END_OF_REPLAY = b"\xff" * 8
_UINT64 = (1 << 64) - 1
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                  "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind")
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


class WireError(ValueError):
    """A message that does not follow vLLM's KV event format; the text says where."""


@dataclass(frozen=True)
class BlocksStored:
    """``BlockStored``: blocks chained from ``parent`` (None: from the sequence start),
    ``tokens`` the concatenation of their ``block_size`` tokens each (of a bigram page,
    each position's own token). ``salt_keys`` are the strings of the first block's extra
    keys (vLLM's ``cache_salt`` rides there) and SGLang's salt fields. ``bigram``: the
    engine sent bigram pages (SGLang under EAGLE)."""

    hashes: tuple[str, ...]
    parent: str | None
    tokens: tuple[int, ...]
    block_size: int
    medium: str | None
    lora_name: str | None
    salt_keys: tuple[str, ...]
    group_idx: int | None
    spec_kind: str | None
    bigram: bool = False


@dataclass(frozen=True)
class BlocksRemoved:
    """``BlockRemoved``: blocks of ``medium`` (None: the device) left the cache."""

    hashes: tuple[str, ...]
    medium: str | None
    group_idx: int | None


@dataclass(frozen=True)
class AllCleared:
    """``AllBlocksCleared``: the engine's prefix cache was reset."""


Event = BlocksStored | BlocksRemoved | AllCleared


@dataclass(frozen=True)
class Batch:
    """One published message: its sequence number, the engine's wall-clock timestamp,
    the events that decoded and how many did not (each counted, then skipped)."""

    seq: int
    ts: float
    events: tuple[Event, ...]
    num_malformed: int


def block_hash(value: object) -> str:
    """Canonical hex text of an engine block hash (a uint64 int or raw bytes)."""
    if type(value) is int:
        return format(value & _UINT64, "016x")
    if isinstance(value, bytes) and value:
        return value.hex()
    raise WireError(f"block hash must be an int or bytes, got {type(value).__name__}")


def decode_seq(frame: bytes) -> int:
    """The 8-byte big-endian sequence number of a message."""
    if len(frame) != 8:
        raise WireError(f"seq frame must be 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big")


def decode_batch(seq: int, payload: bytes) -> Batch:
    """Decode one message's payload; WireError if it is not a batch at all."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise WireError(f"payload is not msgpack: {exc}") from exc
    if isinstance(raw, Mapping):
        ts, items = raw.get("ts"), raw.get("events")
    elif isinstance(raw, Sequence) and not isinstance(raw, (str, bytes)) and len(raw) >= 2:
        ts, items = raw[0], raw[1]
    else:
        raise WireError("payload must be a [ts, events, ...] array or a map")
    if not isinstance(ts, (int, float)) or not isinstance(items, list):
        raise WireError("batch needs a numeric ts and a list of events")
    events: list[Event] = []
    num_malformed = 0
    for item in items:
        try:
            event = decode_event(item)
        except WireError:
            num_malformed += 1
            continue
        if event is not None:
            events.append(event)
    return Batch(seq, float(ts), tuple(events), num_malformed)


def decode_event(item: object) -> Event | None:
    """One event in either encoding; None for an unknown type (ignored)."""
    if isinstance(item, Mapping):
        tag, fields = item.get("type"), item
    elif isinstance(item, list) and item and isinstance(item[0], str):
        tag = item[0]
        names = _STORED_FIELDS if tag == "BlockStored" else _REMOVED_FIELDS
        fields = array_fields(names, item[1:])
    else:
        raise WireError("event must be a tagged map or a tagged array")
    if tag == "BlockStored":
        return _stored(fields)
    if tag == "BlockRemoved":
        return BlocksRemoved(_hashes(fields), _optional(fields, "medium", str),
                             _optional(fields, "group_idx", int))
    if tag == "AllBlocksCleared":
        return AllCleared()
    return None


def _stored(fields: Mapping[str, Any]) -> BlocksStored:
    hashes = _hashes(fields)
    if len(set(hashes)) != len(hashes):
        raise WireError("a stored chain must not name a block hash twice")
    block_size = fields.get("block_size")
    tokens = fields.get("token_ids")
    bigram = is_bigram(tokens)
    if bigram:
        tokens = first_tokens(tokens)
    if type(block_size) is not int or block_size <= 0:
        raise WireError(f"block_size must be a positive int, got {block_size!r}")
    if not isinstance(tokens, list) or len(tokens) != len(hashes) * block_size:
        raise WireError("token_ids must hold block_size tokens per block hash")
    if not all(type(t) is int and 0 <= t <= 0xFFFFFFFF for t in tokens):
        raise WireError("token_ids must be token ids in [0, 2**32)")
    raw_parent = fields.get("parent_block_hash")
    parent = None if raw_parent is None else block_hash(raw_parent)
    if parent in hashes:
        raise WireError("a block cannot be its own chain's parent")
    return BlocksStored(
        hashes=hashes,
        parent=parent,
        tokens=tuple(tokens),
        block_size=block_size,
        medium=_optional(fields, "medium", str),
        lora_name=_optional(fields, "lora_name", str),
        salt_keys=_first_block_strings(fields.get("extra_keys")) + salt_strings(fields),
        group_idx=_optional(fields, "group_idx", int),
        spec_kind=_optional(fields, "kv_cache_spec_kind", str),
        bigram=bigram,
    )


def _hashes(fields: Mapping[str, Any]) -> tuple[str, ...]:
    raw = fields.get("block_hashes")
    if not isinstance(raw, list) or not raw:
        raise WireError("block_hashes must be a non-empty list")
    return tuple(block_hash(h) for h in raw)


def _optional(fields: Mapping[str, Any], name: str, kind: type) -> Any:
    value = fields.get(name)
    if value is not None and type(value) is not kind:
        raise WireError(f"{name} must be {kind.__name__} or null, got {value!r}")
    return value


def _first_block_strings(extra_keys: object) -> tuple[str, ...]:
    """The string items of the first block's extra keys (LoRA name, cache salt)."""
    if not isinstance(extra_keys, list) or not extra_keys:
        return ()
    first = extra_keys[0]
    if not isinstance(first, list):
        return ()
    return tuple(item for item in first if isinstance(item, str))
