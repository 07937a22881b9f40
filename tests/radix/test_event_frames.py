"""The binary form of KV events: frames round-trip, heartbeats are empty frames, and a
malformed frame is refused naming what is wrong."""

from __future__ import annotations

import pytest

from radix.events import (
    FRAME_HEADER,
    HEARTBEAT_FRAME,
    EventBlock,
    EventDecodeError,
    KVEvent,
    decode_event,
    decode_frame,
    encode_event,
    encode_msgpack,
    frame,
)
from radix.keys import to_key

STORED = KVEvent("w1", "e1", 7, "stored", "ab", "public",
                 (EventBlock("aa", None, to_key([1, 2, 3])), EventBlock("bb", "aa", to_key([4]))),
                 "host")
REMOVED = KVEvent("w1", "e1", 8, "removed", "ab", "t", (EventBlock("bb", "aa"),))
CLEARED = KVEvent("w1", "e2", 0, "cleared", "ab", "public")


def body(data: bytes) -> bytes:
    (size,) = FRAME_HEADER.unpack(data[: FRAME_HEADER.size])
    assert size == len(data) - FRAME_HEADER.size
    return data[FRAME_HEADER.size:]


@pytest.mark.parametrize("count", [0, 1, 15, 16, 70_000])
def test_a_frame_of_any_size_round_trips(count: int):
    events = [STORED, REMOVED, CLEARED] * (count // 3) + [STORED] * (count % 3)
    assert decode_frame(body(frame([encode_msgpack(e) for e in events]))) == events


def test_the_heartbeat_is_an_empty_frame_and_the_forms_agree():
    assert decode_frame(body(HEARTBEAT_FRAME)) == []
    for event in (STORED, REMOVED, CLEARED):
        assert decode_event(encode_event(event)) == event
        assert decode_frame(body(frame([encode_msgpack(event)]))) == [event]


@pytest.mark.parametrize("data, field", [
    (b"\x91\x01", r"event frame\[0\]: Expected `array`, got `int`"),
    (b"\x92", "truncated"),
    (b"\xc1", "malformed"),
])
def test_a_malformed_frame_is_refused(data: bytes, field: str):
    with pytest.raises(EventDecodeError, match=field):
        decode_frame(data)
