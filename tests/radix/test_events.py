"""KV event round trips and rejection of malformed events."""

import json

import pytest

from radix.events import EventBlock, EventDecodeError, KVEvent, decode_event, encode_event
from radix.keys import to_key

STORED = KVEvent(
    worker="w1", epoch="e1", seq=7, type="stored", namespace="ab", scope="public",
    blocks=(EventBlock("aa", None, to_key([1, 2, 3])), EventBlock("bb", "aa", to_key([4]))),
)


def test_round_trip_for_each_type():
    removed = KVEvent("w1", "e1", 8, "removed", "ab", "t", (EventBlock("bb", "aa"),))
    cleared = KVEvent("w1", "e2", 0, "cleared", "ab", "public")
    for event in (STORED, removed, cleared):
        assert decode_event(encode_event(event)) == event
        assert decode_event(encode_event(event).encode()) == event
    assert "tokens" not in encode_event(removed)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"type": "evicted"}, "type"),
        ({"seq": -1}, "seq"),
        ({"seq": "7"}, "seq"),
        ({"seq": True}, "seq"),
        ({"worker": ""}, "worker"),
        ({"epoch": None}, "epoch"),
        ({"blocks": {}}, "blocks"),
        ({"blocks": [{"hash": "zz", "tokens": [1]}]}, "hash"),
        ({"blocks": [{"hash": "aa", "parent": 5, "tokens": [1]}]}, "parent"),
        ({"blocks": [{"hash": "aa", "tokens": []}]}, "tokens"),
        ({"blocks": [{"hash": "aa", "tokens": [-1]}]}, "tokens"),
        ({"blocks": [{"hash": "aa", "tokens": [2**32]}]}, "tokens"),
        ({"blocks": [{"hash": "aa", "tokens": [1.5]}]}, "tokens"),
        ({"blocks": ["aa"]}, "blocks"),
    ],
)
def test_malformed_events_name_the_field(change, field):
    wire = {**json.loads(encode_event(STORED)), **change}
    with pytest.raises(EventDecodeError, match=field):
        decode_event(wire)


def test_not_json_and_not_an_object():
    with pytest.raises(EventDecodeError, match="JSON"):
        decode_event("{nope")
    with pytest.raises(EventDecodeError, match="object"):
        decode_event("[1, 2]")
