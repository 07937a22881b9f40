"""vLLM's KV event wire format and its translation into index events.

The decoder takes both event encodings, int and bytes hashes, batches as arrays or
maps, ignores unknown fields and types, and counts malformed events; the translator
maps salts to tenants, lora names to namespaces, media to tiers, keeps a reference
count per engine hash and refuses a store that would file one index block under two
hashes. Each case asserts the exact index outcome.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from radix.keys import to_key
from router.fleet.events.vllm.translate import BlockConflict, VllmTranslator
from router.fleet.events.vllm.wire import (
    AllCleared,
    BlocksRemoved,
    BlocksStored,
    WireError,
    block_hash,
    decode_batch,
)
from router.routing.index import RouterIndex
from tests.support.vllm_publisher import chain_hashes

BLOCK = 4
SALTS = {"salt-alice": "alice", "salt-bob": "bob"}
TOKENS = list(range(100, 112))


def stored_map(hashes, parent=None, tokens=TOKENS, salt="salt-alice", **extra):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": BLOCK, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": [[salt]] + [None] * (len(hashes) - 1),
            "group_idx": 0, "kv_cache_spec_kind": "full_attention", **extra}


def batch(*events, as_map=False, ts=1.5):
    raw = {"ts": ts, "events": list(events)} if as_map else [ts, list(events), 0]
    return msgspec.msgpack.encode(raw)


def test_map_and_array_events_decode_alike_with_int_or_bytes_hashes():
    hashes = chain_hashes(TOKENS, BLOCK)
    as_map = decode_batch(3, batch(stored_map(hashes)))
    as_array = decode_batch(3, batch(["BlockStored", [h.to_bytes(8, "big") for h in hashes], None,
                                      TOKENS, BLOCK, None, "GPU", None, [["salt-alice"], None, None], 0,
                                      "full_attention"],
                                     as_map=True))
    assert as_map.events == as_array.events
    (event,) = as_map.events
    assert isinstance(event, BlocksStored)
    assert event.hashes == tuple(format(h, "016x") for h in hashes)
    assert (event.parent, event.block_size, event.salt_keys, event.tokens) == (
        None, BLOCK, ("salt-alice",), tuple(TOKENS))
    assert (as_map.seq, as_map.ts, as_map.num_malformed) == (3, 1.5, 0)


def test_unknown_types_are_ignored_and_malformed_events_counted():
    hashes = chain_hashes(TOKENS, BLOCK)
    decoded = decode_batch(0, batch(
        {"type": "SomethingNew", "x": 1},
        stored_map(hashes, tokens=TOKENS[:-1]),           # token count does not fit
        {"type": "BlockRemoved", "block_hashes": "nope"},
        ["BlockRemoved", [hashes[0]], "CPU"],
        {"type": "AllBlocksCleared"},
        42,
    ))
    assert decoded.events == (BlocksRemoved((format(hashes[0], "016x"),), "CPU", None),
                              AllCleared())
    assert decoded.num_malformed == 3


@pytest.mark.parametrize("payload", [b"\xc1garbage", msgspec.msgpack.encode("text"),
                                     msgspec.msgpack.encode([1.0, "not a list"])])
def test_a_payload_that_is_no_batch_is_refused(payload):
    with pytest.raises(WireError):
        decode_batch(0, payload)


def test_negative_and_bytes_hashes_are_canonical():
    assert block_hash(-1) == "ff" * 8
    assert block_hash(b"\x00\x01") == "0001"
    with pytest.raises(WireError):
        block_hash("abc")


def apply(index, translator, *events, seq=0):
    for event in decode_batch(seq, batch(*events)).events:
        for translated in translator.translate(seq, event):
            index.apply_event("v0", translated)


def make(lora_namespaces=None):
    namespaces = {None: "base", **(lora_namespaces or {})}
    return RouterIndex(), VllmTranslator("v0", SALTS.get, namespaces.__getitem__)


def test_the_salt_gives_the_tenant_and_later_blocks_inherit_it():
    index, translator = make()
    first = chain_hashes(TOKENS[:8], BLOCK, "salt-alice")
    apply(index, translator, stored_map(first, tokens=TOKENS[:8]))
    more = chain_hashes(TOKENS[8:], BLOCK, parent=first[-1])
    apply(index, translator, stored_map(more, parent=first[-1], tokens=TOKENS[8:], extra_keys=None))
    assert index.match("base", to_key(TOKENS + [1]), "alice") == {"v0": 12}
    assert index.match("base", to_key(TOKENS), "bob") == {}
    index.check_invariants()


def test_a_salt_the_router_did_not_issue_is_credited_to_no_tenant():
    index, translator = make()
    hashes = chain_hashes(TOKENS, BLOCK, "someone-else")
    apply(index, translator, stored_map(hashes, salt="someone-else"),
          stored_map(chain_hashes(TOKENS, BLOCK, "x"), salt=None))
    assert index.stats().num_blocks == {}
    assert translator.num_unknown_salt_blocks == 6


def test_lora_name_selects_the_adapters_namespace():
    index, translator = make({"sql-lora": "lora-ns"})
    hashes = chain_hashes(TOKENS, BLOCK, "salt-bob")
    apply(index, translator, stored_map(hashes, salt="salt-bob", lora_name="sql-lora"))
    assert index.match("lora-ns", to_key(TOKENS), "bob") == {"v0": 12}
    assert index.match("base", to_key(TOKENS), "bob") == {}


def test_a_cpu_tier_hit_counts_below_a_device_hit():
    index, translator = make()
    hashes = chain_hashes(TOKENS, BLOCK, "salt-alice")
    apply(index, translator, stored_map(hashes[:1], tokens=TOKENS[:4]))
    apply(index, translator, stored_map(hashes[1:], parent=hashes[0], tokens=TOKENS[4:],
                                        medium="CPU", extra_keys=None))
    assert index.match("base", to_key(TOKENS), "alice") == {"v0": 4 + int(0.5 * 8)}


def test_a_duplicate_block_survives_the_removal_of_one_copy():
    index, translator = make()
    hashes = chain_hashes(TOKENS, BLOCK, "salt-alice")
    apply(index, translator, stored_map(hashes), stored_map(hashes[:1], tokens=TOKENS[:4]))
    apply(index, translator, {"type": "BlockRemoved", "block_hashes": [hashes[0]], "medium": "GPU"})
    assert index.match("base", to_key(TOKENS), "alice") == {"v0": 12}
    apply(index, translator, {"type": "BlockRemoved", "block_hashes": [hashes[2], hashes[0]],
                              "medium": None, "group_idx": 0})
    assert index.match("base", to_key(TOKENS), "alice") == {}
    assert index.stats().num_blocks == {}
    index.check_invariants()


def test_a_parent_that_leaves_first_takes_its_descendants_with_it():
    index, translator = make()
    hashes = chain_hashes(TOKENS, BLOCK, "salt-alice")
    apply(index, translator, stored_map(hashes[:2], tokens=TOKENS[:8]),
          stored_map(hashes[2:], parent=hashes[1], tokens=TOKENS[8:], extra_keys=None))
    apply(index, translator, {"type": "BlockRemoved", "block_hashes": [hashes[1]], "medium": "GPU"})
    assert index.match("base", to_key(TOKENS), "alice") == {"v0": 4}
    assert translator.num_blocks() == {"device": 1}
    apply(index, translator, {"type": "BlockRemoved", "block_hashes": [hashes[2]], "medium": "GPU"})
    index.check_invariants()


def test_only_the_full_attention_group_is_indexed():
    index, translator = make()
    hashes = chain_hashes(TOKENS, BLOCK, "salt-alice")
    apply(index, translator, stored_map(hashes, group_idx=1, kv_cache_spec_kind="sliding_window"),
          stored_map(hashes[:1], tokens=TOKENS[:4], group_idx=0))
    apply(index, translator, {"type": "BlockRemoved", "block_hashes": [hashes[0]], "group_idx": 1,
                              "medium": "GPU"})
    assert index.match("base", to_key(TOKENS), "alice") == {"v0": 4}
    assert translator.num_skipped_group_events == 2


def test_all_blocks_cleared_empties_the_worker():
    index, translator = make()
    apply(index, translator, stored_map(chain_hashes(TOKENS, BLOCK, "salt-alice")))
    apply(index, translator, {"type": "AllBlocksCleared"})
    assert index.match("base", to_key(TOKENS), "alice") == {}
    assert translator.num_blocks() == {}


def test_a_chain_naming_a_hash_twice_or_itself_as_parent_is_malformed():
    a, b = chain_hashes(TOKENS[:8], BLOCK)
    decoded = decode_batch(0, batch(stored_map([a, b, a]), stored_map([a], parent=a, tokens=TOKENS[:4]),
                                    {"type": "BlockRemoved", "block_hashes": [a, a]}))
    assert decoded.num_malformed == 2
    assert decoded.events == (BlocksRemoved((format(a, "016x"),) * 2, None, None),)


def test_a_block_stored_again_under_another_hash_is_refused_with_nothing_changed():
    index, translator = make()
    hashes = chain_hashes(TOKENS, BLOCK, "salt-alice")
    apply(index, translator, stored_map(hashes))
    other = chain_hashes(TOKENS[:8], BLOCK, "elsewhere")
    (event,) = decode_batch(1, batch(stored_map(other, tokens=TOKENS[:8]))).events
    with pytest.raises(BlockConflict):
        translator.translate(1, event)
    assert translator.num_blocks() == {"device": 3}
    apply(index, translator, stored_map(other[:1], tokens=TOKENS[:4], salt="salt-bob"))
    assert index.match("base", to_key(TOKENS), "bob") == {"v0": 4}  # another tenant: its own
    apply(index, translator, {"type": "BlockRemoved", "block_hashes": [hashes[0]]})
    assert index.match("base", to_key(TOKENS), "alice") == {}
    index.check_invariants()


def random_event(rnd: random.Random) -> dict:
    """A store, removal or clear over a few hashes, tokens, salts, tiers and groups."""
    hashes = [rnd.randint(1, 6) for _ in range(rnd.randint(1, 3))]
    medium, roll = rnd.choice(["GPU", "CPU", None]), rnd.random()
    if roll < 0.55:
        return stored_map(hashes, parent=rnd.choice([None, None, rnd.randint(1, 6)]),
                          tokens=[rnd.randint(0, 3) for _ in range(len(hashes) * BLOCK)],
                          salt=rnd.choice(["salt-alice", "salt-bob", "unknown"]),
                          medium=medium, lora_name=rnd.choice([None, "x"]),
                          group_idx=rnd.choice([0, 0, 1, None]))
    if roll < 0.95:
        return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium,
                "group_idx": rnd.choice([0, 0, 1, None])}
    return {"type": "AllBlocksCleared"}


def run_sequence(seed: int) -> None:
    """Twelve random batches: every event applies or is refused, and the index is
    consistent after each batch and after the worker is dropped."""
    rnd = random.Random(seed)
    index, translator = make({"x": "lora-x"})
    for seq in range(12):
        for event in decode_batch(seq, batch(*(random_event(rnd)
                                               for _ in range(rnd.randint(1, 3))))).events:
            try:
                translated = translator.translate(seq, event)
            except BlockConflict:
                continue
            for index_event in translated:
                index.apply_event("v0", index_event)
        index.check_invariants()
    index.reset_worker("v0")
    index.check_invariants()


def test_any_sequence_of_events_keeps_the_index_consistent():
    """Hostile sequences (colliding hashes, repeated tokens, mixed tiers, tenants and
    adapters). Before the conflict check, seeds 293 and two others of these 1,000 left
    the index inconsistent (one block filed under two hashes)."""
    for seed in range(1000):
        try:
            run_sequence(seed)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from exc
