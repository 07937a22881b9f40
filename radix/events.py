"""KV events: the replicated log of what each worker's prefix cache holds.

Wire form (one JSON object per event)::

    {"worker": str, "epoch": str, "seq": int, "type": "stored"|"removed"|"cleared",
     "namespace": hex str, "scope": str,
     "blocks": [{"hash": hex, "parent": hex|null, "tokens": [int, ...]}],
     "medium"?: "device"|"host"|"disk"}

``tokens`` only for ``stored``; ``parent`` may be null for ``removed``. ``medium``
says which tier the blocks entered or left: absent means ``device`` (the only one
before the host tier); ``host`` events describe the worker's host-memory tier,
``disk`` events its disk tier below that. ``epoch``
changes at every worker start; ``seq`` is gapless per worker and epoch. See
docs/protocol.md for the block model and the snapshot rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import orjson

EventType = Literal["stored", "removed", "cleared"]
EVENT_TYPES: tuple[EventType, ...] = ("stored", "removed", "cleared")
Medium = Literal["device", "host", "disk"]
MEDIA: tuple[Medium, ...] = ("device", "host", "disk")
MAX_TOKEN_ID = 2**32 - 1


class EventDecodeError(ValueError):
    """A KV event that does not follow the schema; the message names the field."""


@dataclass(frozen=True)
class EventBlock:
    """One block: its chained hash, its parent's hash, and (for ``stored``) its tokens."""

    hash: str
    parent: str | None = None
    tokens: tuple[int, ...] | None = None


@dataclass(frozen=True)
class KVEvent:
    """One entry of a worker's KV event log."""

    worker: str
    epoch: str
    seq: int
    type: EventType
    namespace: str
    scope: str
    blocks: tuple[EventBlock, ...] = ()
    medium: Medium = "device"

    def to_dict(self) -> dict[str, object]:
        """The wire object (``tokens`` left out unless stored; ``medium`` left out for the
        device)."""
        blocks = []
        for block in self.blocks:
            item: dict[str, object] = {"hash": block.hash, "parent": block.parent}
            if self.type == "stored":
                item["tokens"] = list(block.tokens or ())
            blocks.append(item)
        wire: dict[str, object] = {
            "worker": self.worker,
            "epoch": self.epoch,
            "seq": self.seq,
            "type": self.type,
            "namespace": self.namespace,
            "scope": self.scope,
            "blocks": blocks,
        }
        if self.medium != "device":
            wire["medium"] = self.medium
        return wire


def encode_event(event: KVEvent) -> str:
    """Compact JSON text of ``event``."""
    return orjson.dumps(event.to_dict()).decode()


def decode_event(data: str | bytes | Mapping[str, object]) -> KVEvent:
    """Parse and validate one event; raises EventDecodeError naming the bad field."""
    if isinstance(data, (str, bytes)):
        try:
            data = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise EventDecodeError(f"event is not JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise EventDecodeError("event must be a JSON object")
    kind = data.get("type")
    if kind not in EVENT_TYPES:
        raise EventDecodeError(f"event.type must be one of {EVENT_TYPES}, got {kind!r}")
    seq = data.get("seq")
    if type(seq) is not int or seq < 0:
        raise EventDecodeError(f"event.seq must be a non-negative integer, got {seq!r}")
    medium = data.get("medium", "device")
    if medium not in MEDIA:
        raise EventDecodeError(f"event.medium must be one of {MEDIA}, got {medium!r}")
    raw_blocks = data.get("blocks", [])
    if not isinstance(raw_blocks, list):
        raise EventDecodeError("event.blocks must be a list")
    return KVEvent(
        worker=_text(data, "worker"),
        epoch=_text(data, "epoch"),
        seq=seq,
        type=kind,
        namespace=_text(data, "namespace"),
        scope=_text(data, "scope"),
        blocks=tuple(_block(item, i, kind) for i, item in enumerate(raw_blocks)),
        medium=medium,
    )


def _text(data: Mapping[str, object], name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str) or not value:
        raise EventDecodeError(f"event.{name} must be a non-empty string, got {value!r}")
    return value


def _hex(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise EventDecodeError(f"{where} must be a hex string, got {value!r}")
    try:
        bytes.fromhex(value)
    except ValueError as exc:
        raise EventDecodeError(f"{where} must be a hex string, got {value!r}") from exc
    return value


def _block(item: object, index: int, kind: EventType) -> EventBlock:
    where = f"event.blocks[{index}]"
    if not isinstance(item, Mapping):
        raise EventDecodeError(f"{where} must be an object")
    parent = item.get("parent")
    parent = None if parent is None else _hex(parent, f"{where}.parent")
    tokens = None
    if kind == "stored":
        raw = item.get("tokens")
        if not isinstance(raw, list) or not raw:
            raise EventDecodeError(f"{where}.tokens must be a non-empty list for stored")
        if not all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in raw):
            raise EventDecodeError(f"{where}.tokens must hold token ids in [0, 2**32)")
        tokens = tuple(raw)
    return EventBlock(hash=_hex(item.get("hash"), f"{where}.hash"), parent=parent, tokens=tokens)
