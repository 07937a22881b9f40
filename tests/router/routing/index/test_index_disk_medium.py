"""RouterIndex with disk-tier events: a disk hit counts for ``disk_hit_weight`` of a
device hit (never more than a host hit), chains from device or host blocks, and a
restarted worker's disk snapshot alone is a (weighted) hit."""

from __future__ import annotations

from msgspec.structs import replace

from radix.events import EventBlock, KVEvent, decode_event, encode_event
from radix.keys import to_key
from radix.tree import PUBLIC
from router.config import IndexConfig
from router.routing.index import RouterIndex

NS = "ab" * 32
A0, A1, A2 = ("a0", None, [1, 2, 3, 4]), ("a1", "a0", [5, 6, 7, 8]), ("a2", "a1", [9, 10, 11, 12])
PROMPT = to_key([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13])


def event(kind: str, *blocks: tuple, medium: str = "device") -> KVEvent:
    return KVEvent("w", "e", 1, kind, NS, PUBLIC,  # type: ignore[arg-type]
                   tuple(EventBlock(h, p, to_key(t) if kind == "stored" else None)
                         for h, p, t in blocks), medium)  # type: ignore[arg-type]


def test_device_host_and_disk_tokens_count_with_falling_weights():
    index = RouterIndex(IndexConfig(host_hit_weight=0.5, disk_hit_weight=0.25))
    index.apply_event("w1", event("stored", A0))
    index.apply_event("w1", event("stored", A1, medium="host"))
    index.apply_event("w1", event("stored", A2, medium="disk"))  # chains from a host block
    assert index.match(NS, PROMPT, PUBLIC) == {"w1": 4 + 2 + 1}
    # the host block moves down too: stored on disk before it leaves the host index
    index.apply_event("w1", event("stored", A1, medium="disk"))
    index.apply_event("w1", event("removed", A1, medium="host"))
    assert index.match(NS, PROMPT, PUBLIC) == {"w1": 4 + 2}
    index.check_invariants()
    index.apply_event("w1", event("removed", A2, medium="disk"))
    assert index.match(NS, PROMPT, PUBLIC) == {"w1": 4 + 1}
    index.apply_event("w1", replace(event("cleared"), blocks=()))
    assert index.match(NS, PROMPT, PUBLIC) == {}
    index.check_invariants()


def test_match_tiers_gives_each_worker_its_device_chain_and_its_chain_in_any_tier():
    index = RouterIndex(IndexConfig(host_hit_weight=0.5, disk_hit_weight=0.25))
    index.apply_event("w1", event("stored", A0))
    index.apply_event("w1", event("stored", A1, medium="host"))
    index.apply_event("w1", event("stored", A2, medium="disk"))
    index.apply_event("w2", event("stored", A0, A1))
    index.apply_event("w3", event("stored", A0, A1, A2, medium="disk"))
    assert index.match_tiers(NS, PROMPT, PUBLIC) == {"w1": (4, 12), "w2": (8, 8),
                                                     "w3": (0, 12)}
    index.note_routed(NS, "w4", PROMPT, PUBLIC)  # speculative: never a stored chain
    index.set_stale("w2")
    assert index.match_tiers(NS, PROMPT, PUBLIC) == {"w1": (4, 12), "w3": (0, 12)}
    assert index.match_tiers("cd" * 32, PROMPT, PUBLIC) == {}


def test_a_restarted_worker_with_only_a_disk_snapshot_ranks_below_a_host_hit():
    index = RouterIndex(IndexConfig(host_hit_weight=0.5, disk_hit_weight=0.25))
    index.apply_event("w1", replace(event("cleared"), blocks=()))  # the new epoch's snapshot
    index.apply_event("w1", event("stored", A0, A1, A2, medium="disk"))
    index.apply_event("w2", event("stored", A0, A1, A2, medium="host"))
    assert index.match(NS, PROMPT, PUBLIC) == {"w1": 3, "w2": 6}


def test_a_disk_weight_above_the_host_weight_counts_as_the_host_weight():
    index = RouterIndex(IndexConfig(host_hit_weight=0.25, disk_hit_weight=1.0))
    index.apply_event("w1", event("stored", A0, A1, A2, medium="disk"))
    assert index.match(NS, PROMPT, PUBLIC) == {"w1": 3}


def test_disk_events_round_trip_with_their_medium():
    disk = event("stored", A0, medium="disk")
    assert '"medium":"disk"' in encode_event(disk)
    assert decode_event(encode_event(disk)) == disk
