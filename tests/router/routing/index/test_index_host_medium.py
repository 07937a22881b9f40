"""RouterIndex with host-tier events: a host hit counts for ``host_hit_weight`` of a
device hit, chains from device blocks, and leaves with ``removed``/``cleared``."""

from __future__ import annotations

from msgspec.structs import replace

from radix.events import EventBlock, KVEvent, decode_event, encode_event
from radix.keys import to_key
from radix.tree import PUBLIC
from router.config import IndexConfig
from router.routing.index import RouterIndex

NS = "ab" * 32
A0, A1, A2 = ("a0", None, [1, 2, 3, 4]), ("a1", "a0", [5, 6, 7, 8]), ("a2", "a1", [9, 10, 11, 12])
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]


def event(kind: str, *blocks: tuple, medium: str = "device") -> KVEvent:
    return KVEvent("w", "e", 1, kind, NS, PUBLIC,  # type: ignore[arg-type]
                   tuple(EventBlock(h, p, to_key(t) if kind == "stored" else None)
                         for h, p, t in blocks), medium)  # type: ignore[arg-type]


def test_host_blocks_count_for_part_of_a_device_hit():
    index = RouterIndex(IndexConfig(host_hit_weight=0.5))
    index.apply_event("w1", event("stored", A0, A1, A2))
    index.apply_event("w2", event("stored", A0, A1, A2))
    # w1 moves its last two blocks to host memory: removed from the device, stored on host
    index.apply_event("w1", event("removed", A1, A2))
    index.apply_event("w1", event("stored", A1, A2, medium="host"))
    assert index.match(NS, to_key(PROMPT), PUBLIC) == {"w1": 4 + 4, "w2": 12}
    index.check_invariants()
    index.apply_event("w1", event("removed", A2, medium="host"))  # the host tier drops one
    assert index.match(NS, to_key(PROMPT), PUBLIC) == {"w1": 4 + 2, "w2": 12}
    index.apply_event("w1", event("stored", A1))  # copied back to the device
    index.apply_event("w1", event("removed", A1, medium="host"))
    assert index.match(NS, to_key(PROMPT), PUBLIC)["w1"] == 8
    index.apply_event("w1", replace(event("cleared"), blocks=()))
    assert "w1" not in index.match(NS, to_key(PROMPT), PUBLIC)
    index.check_invariants()


def test_medium_is_on_the_wire_only_for_host_events():
    host = event("stored", A0, medium="host")
    assert '"medium":"host"' in encode_event(host)
    assert decode_event(encode_event(host)) == host
    device = event("stored", A0)
    assert "medium" not in encode_event(device)
    assert decode_event(encode_event(device)).medium == "device"
