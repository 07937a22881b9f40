"""KV events: the replicated log of what each worker's prefix cache holds.

JSON form (one object per event, NDJSON on a stream: for people and older routers)::

    {"worker": str, "epoch": str, "seq": int, "type": "stored"|"removed"|"cleared",
     "namespace": hex str, "scope": str,
     "blocks": [{"hash": hex, "parent": hex|null, "tokens": [int, ...]}],
     "medium"?: "device"|"host"|"disk"}

``tokens`` only for ``stored``; ``parent`` may be null for ``removed``. ``medium``
says which tier the blocks entered or left: absent means ``device`` (the only one
before the host tier); ``host`` events describe the worker's host-memory tier,
``disk`` events its disk tier below that. ``epoch`` changes at every worker start;
``seq`` is gapless per worker and epoch. See docs/protocol.md for the block model and
the snapshot rules.

Binary form (what routers ask for): frames of a 4-byte big-endian length and a
msgpack array of events, each event and block a msgpack array of its fields in
declaration order, a block's tokens as their ``radix.keys`` bytes. An empty array is
a heartbeat. ``EventBlock.key`` holds tokens that way in memory too, so neither side
converts token ids on the way.

Load frames (binary form only, and only to a consumer that asks with
``LOAD_QUERY``; the worker says it will send them with the response header
``LOAD_FRAMES_HEADER``): a frame whose body is a msgpack *map*, a ``LoadReport``,
where an event frame's is an array. The worker sends one when its load changes (at
most every few milliseconds, coalesced), right after the heartbeat that follows its
backlog or snapshot, and in place of the idle heartbeat. A router that does not ask
gets none; a worker that does not know the query sends none and no header. Fields a
decoder does not know are ignored and missing ones take their defaults, so the map can
grow without a new version.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Annotated, Literal

import msgspec
import orjson

from radix.keys import from_key, to_key

EventType = Literal["stored", "removed", "cleared"]
EVENT_TYPES: tuple[EventType, ...] = ("stored", "removed", "cleared")
Medium = Literal["device", "host", "disk"]
MEDIA: tuple[Medium, ...] = ("device", "host", "disk")
MAX_TOKEN_ID = 2**32 - 1
MSGPACK_CONTENT_TYPE = "application/x-msgpack"
FRAME_HEADER = struct.Struct(">I")
HEARTBEAT_FRAME = FRAME_HEADER.pack(1) + b"\x90"
LOAD_QUERY = ("load", "1")
LOAD_FRAMES_HEADER = "X-Load-Frames"

_Text = Annotated[str, msgspec.Meta(min_length=1)]
_Hex = Annotated[str, msgspec.Meta(min_length=1, pattern="^[0-9a-fA-F]+$")]
_TokenId = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKEN_ID)]
_Seq = Annotated[int, msgspec.Meta(ge=0)]
_Count = Annotated[int, msgspec.Meta(ge=0)]


class EventDecodeError(ValueError):
    """A KV event that does not follow the schema; the message names the field."""


class EventBlock(msgspec.Struct, frozen=True, array_like=True):
    """One block: its chained hash, its parent's hash, and (for ``stored``) its tokens
    as a ``radix.keys`` key."""

    hash: _Text
    parent: _Text | None = None
    key: bytes | None = None

    @property
    def tokens(self) -> tuple[int, ...] | None:
        """The block's token ids (None outside ``stored``)."""
        return None if self.key is None else tuple(from_key(self.key))


class _EventHead(msgspec.Struct, frozen=True):
    """The fields every form of an event starts with, in the wire order."""

    worker: _Text
    epoch: _Text
    seq: _Seq
    type: EventType
    namespace: _Text
    scope: _Text


class KVEvent(_EventHead, frozen=True, array_like=True):
    """One entry of a worker's KV event log."""

    blocks: tuple[EventBlock, ...] = ()
    medium: Medium = "device"

    def to_dict(self) -> dict[str, object]:
        """The JSON object (``tokens`` left out unless stored; ``medium`` left out for
        the device)."""
        blocks = []
        for block in self.blocks:
            item: dict[str, object] = {"hash": block.hash, "parent": block.parent}
            if self.type == "stored":
                item["tokens"] = from_key(block.key or b"")
            blocks.append(item)
        wire: dict[str, object] = {
            "worker": self.worker, "epoch": self.epoch, "seq": self.seq, "type": self.type,
            "namespace": self.namespace, "scope": self.scope, "blocks": blocks}
        if self.medium != "device":
            wire["medium"] = self.medium
        return wire


class LoadReport(msgspec.Struct, frozen=True, omit_defaults=True):
    """A worker's load at one instant, the body of a load frame. ``seq`` counts the
    worker's reports since it started (a heartbeat repeats the last one's);
    ``kv_cache_usage_ratio`` is the share of KV blocks running sequences hold;
    ``max_num_requests`` the most requests it admits at once (running plus queued) and
    ``max_num_running`` of those the most it runs; ``num_held_blocks`` and
    ``max_held_blocks`` a prefill worker's blocks held for consumers and its cap on them
    (0: none). ``ready_seq`` moves whenever what the worker's ``/ready`` says beyond its
    free blocks changed (readiness, draining, adapters and their residency): a router
    probes ``/ready`` again then."""

    seq: _Seq
    num_requests_running: _Count = 0
    num_requests_waiting: _Count = 0
    num_waiting_tokens: _Count = 0
    kv_cache_usage_ratio: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0
    max_num_requests: _Count | None = None
    max_num_running: _Count | None = None
    num_held_blocks: _Count = 0
    max_held_blocks: _Count = 0
    ready_seq: _Count = 0


class _JsonBlock(msgspec.Struct, forbid_unknown_fields=False):
    hash: _Hex
    parent: _Hex | None = None
    tokens: list[_TokenId] | None = None


class _JsonEvent(_EventHead, forbid_unknown_fields=False):
    blocks: list[_JsonBlock] = []
    medium: Medium = "device"


_JSON_DECODER = msgspec.json.Decoder(_JsonEvent)
_FRAME_DECODER = msgspec.msgpack.Decoder(list[KVEvent] | LoadReport)
_MSGPACK = msgspec.msgpack.Encoder()


def encode_event(event: KVEvent) -> str:
    """Compact JSON text of ``event``."""
    return orjson.dumps(event.to_dict()).decode()


def decode_event(data: str | bytes | Mapping[str, object]) -> KVEvent:
    """Parse and validate one JSON event; raises EventDecodeError naming the bad field."""
    try:
        if isinstance(data, (str, bytes)):
            wire = _JSON_DECODER.decode(data)
        elif isinstance(data, Mapping):
            wire = msgspec.convert(data, _JsonEvent)
        else:
            raise EventDecodeError("event must be a JSON object")
    except msgspec.ValidationError as exc:
        raise EventDecodeError(_naming_the_field("event", exc)) from None
    except msgspec.DecodeError as exc:
        raise EventDecodeError(f"event is not JSON: {exc}") from None
    blocks = []
    for i, block in enumerate(wire.blocks):
        key = None
        if wire.type == "stored":
            if not block.tokens:
                raise EventDecodeError(f"event.blocks[{i}].tokens must be a non-empty list "
                                       f"for stored")
            key = to_key(block.tokens)
        blocks.append(EventBlock(block.hash, block.parent, key))
    return KVEvent(wire.worker, wire.epoch, wire.seq, wire.type, wire.namespace, wire.scope,
                   tuple(blocks), wire.medium)


def encode_msgpack(event: KVEvent) -> bytes:
    """``event`` in the binary form (one array; ``frame`` joins several)."""
    return _MSGPACK.encode(event)


def frame(encoded_events: Sequence[bytes]) -> bytes:
    """One frame of the binary stream holding the events ``encode_msgpack`` gave."""
    count = len(encoded_events)
    if count < 16:
        head = bytes((0x90 | count,))
    elif count < 2**16:
        head = b"\xdc" + count.to_bytes(2, "big")
    else:
        head = b"\xdd" + count.to_bytes(4, "big")
    body = head + b"".join(encoded_events)
    return FRAME_HEADER.pack(len(body)) + body


def load_frame(report: LoadReport) -> bytes:
    """One load frame of the binary stream."""
    body = _MSGPACK.encode(report)
    return FRAME_HEADER.pack(len(body)) + body


def decode_frame(body: bytes) -> list[KVEvent] | LoadReport:
    """The events of one frame's body (after its length), or the load it reports;
    raises EventDecodeError on anything but a msgpack array of events of the schema's
    types or a map of a ``LoadReport``. A stored block's key holding no whole tokens is
    the consumer's to refuse (the index counts it as an orphan), so decoding costs no
    Python call per block."""
    try:
        return _FRAME_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise EventDecodeError(_naming_the_field("event frame", exc)) from None
    except msgspec.DecodeError as exc:
        raise EventDecodeError(f"event frame: {exc}") from None


def _naming_the_field(what: str, exc: msgspec.ValidationError) -> str:
    """msgspec's "Expected ... - at `$.blocks[0].hash`" as "event.blocks[0].hash:
    Expected ..."."""
    message, _, path = str(exc).partition(" - at `$")
    return f"{what}{path.rstrip('`')}: {message}"
