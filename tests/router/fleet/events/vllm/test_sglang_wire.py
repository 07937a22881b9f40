"""SGLang's KV event layouts, release by release, decoded and followed into the index.

Each batch is encoded by msgspec from structs declared as that release's
``python/sglang/srt/disaggregation/kv_events.py`` declares them (read in the sglang
wheels on PyPI): 0.4.10 to 0.5.11 tagged arrays with no medium and no salt; 0.5.12 to
0.5.17 a ``medium`` added; 0.5.18 and 0.5.19 no ``omit_defaults`` and a salted store a
``BlockStoredWithMetadata`` (``metadata`` ``{"cache_salt"}`` appended to the array);
0.5.20 on tagged maps with ``cache_salt`` and ``session_id`` (0.5.22 on ``lora_name``
too). So the bytes are the ones SGLang publishes. The test against SGLang's own
publisher is test_sglang_publisher.py.
"""

from __future__ import annotations

from typing import Any

import msgspec

from radix.keys import to_key
from router.fleet.events.vllm.translate import VllmTranslator
from router.fleet.events.vllm.wire import BlocksStored, decode_batch
from router.routing.index import RouterIndex

PAGE = 4
SALTS = {"salt-alice": "alice", "salt-bob": "bob"}
TOKENS = list(range(100, 112))
HASHES = [-5, 7, -(2**63)]  # SGLang's hashes are signed int64


class Batch(msgspec.Struct, array_like=True, gc=False):
    """``EventBatch`` (0.5.18 on; earlier releases only add ``omit_defaults``, which
    leaves the same bytes for a batch with its rank)."""

    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


# BlockStored's fields in every release, then what each release appended.
STORED = [("block_hashes", list[int]), ("parent_block_hash", int | None),
          ("token_ids", list[Any]), ("block_size", int), ("lora_id", int | None)]
MEDIUM = [("medium", str | None, None)]


def release(stored: list, removed: list, **options: bool) -> tuple[type, type]:
    """A release's ``BlockStored`` with ``stored`` fields and ``BlockRemoved`` with
    ``removed`` fields, under a tagged base encoded as ``options`` say."""
    base = msgspec.defstruct("KVCacheEvent", [], gc=False, tag=True, **options)
    return (msgspec.defstruct("BlockStored", stored, bases=(base,)),
            msgspec.defstruct("BlockRemoved", removed, bases=(base,)))


def release_0_5_11() -> tuple[type, type]:
    stored, removed = release(STORED, STORED[:1], array_like=True, omit_defaults=True)
    return stored, removed


def release_0_5_19() -> tuple[type, type, type, type]:
    stored, removed = release(STORED + MEDIUM, STORED[:1] + MEDIUM, array_like=True)
    metadata = msgspec.defstruct("BlockStoredMetadata", [("cache_salt", str)],
                                 omit_defaults=True, gc=False)
    salted = msgspec.defstruct("BlockStoredWithMetadata", [("metadata", metadata)],
                               bases=(stored,), tag="BlockStored", kw_only=True)
    return stored, salted, metadata, removed


def release_0_5_22() -> tuple[type, type]:
    more = [(name, str | None, None) for name in ("cache_salt", "session_id", "lora_name")]
    stored, removed = release(STORED + MEDIUM + more, STORED[:1] + MEDIUM,
                                 omit_defaults=True)
    return stored, removed


def follow(*batches: list[Any]) -> tuple[RouterIndex, list]:
    """An index fed ``batches`` (as SGLang encodes them) through the translator; the
    decoded events."""
    index = RouterIndex()
    translator = VllmTranslator("s0", SALTS.get, lambda lora: f"ns:{lora or '-'}")
    decoded = []
    for seq, events in enumerate(batches):
        payload = msgspec.msgpack.encode(Batch(1.0, events, 0))
        batch = decode_batch(seq, payload)
        assert batch.num_malformed == 0
        for event in batch.events:
            decoded.append(event)
            for index_event in translator.translate(seq, event):
                index.apply_event("s0", index_event)
    index.check_invariants()
    return index, decoded


def held(index: RouterIndex, tenant: str, lora: str | None = None,
         tokens: list[int] = TOKENS) -> int:
    return index.match(f"ns:{lora or '-'}", to_key(tokens), tenant).get("s0", 0)


def test_before_0_5_18_stores_carry_no_salt_and_are_credited_to_no_tenant():
    stored, removed = release_0_5_11()
    index, (event, gone) = follow([stored(HASHES, None, TOKENS, PAGE, None),
                                   removed(HASHES[2:])])
    assert isinstance(event, BlocksStored)
    assert (event.hashes[0], event.salt_keys, event.tokens) == ("f" * 15 + "b", (), tuple(TOKENS))
    assert held(index, "alice") == held(index, "bob") == 0


def test_0_5_18_metadata_salt_in_place_of_vllms_lora_name_scopes_the_chain():
    stored, salted, metadata, removed = release_0_5_19()
    index, events = follow(
        [salted(HASHES, None, TOKENS, PAGE, None, "GPU", metadata=metadata("salt-alice")),
         stored([11], None, TOKENS[:PAGE], PAGE, None, "GPU")],
        [removed(HASHES[2:], "GPU")])
    assert events[0].salt_keys == ("salt-alice",) and events[0].lora_name is None
    assert events[1].salt_keys == ()
    assert held(index, "alice") == 8 and held(index, "bob") == 0


def test_0_5_20_maps_carry_the_salt_the_adapter_and_the_host_tier():
    stored, removed = release_0_5_22()
    index, _ = follow([
        stored(HASHES, None, TOKENS, PAGE, None, "GPU", "salt-alice", "session-1"),
        stored([21, 22], None, TOKENS[:8], PAGE, None, "GPU", "salt-bob", lora_name="a"),
        stored(HASHES[2:], HASHES[1], TOKENS[8:], PAGE, None, "CPU_PINNED", "salt-alice"),
    ])
    assert held(index, "alice") == 12 and held(index, "bob") == 0
    assert held(index, "bob", "a") == 8 and held(index, "alice", "a") == 0
    index_after, _ = follow(
        [stored(HASHES, None, TOKENS, PAGE, None, "GPU", "salt-alice")],
        [removed(HASHES[2:], "GPU")],
        [stored(HASHES[2:], HASHES[1], TOKENS[8:], PAGE, None, "CPU_PINNED", "salt-alice")])
    device_only = held(index_after, "alice", tokens=TOKENS[:8])
    with_host = held(index_after, "alice")
    assert device_only == 8 and 8 < with_host < 12  # the host page weighs less


def test_one_removal_of_several_tenants_and_adapters_removes_each_of_them():
    stored, removed = release_0_5_22()
    index, _ = follow([
        stored([1, 2], None, TOKENS[:8], PAGE, None, "GPU", "salt-alice"),
        stored([3, 4], None, TOKENS[:8], PAGE, None, "GPU", "salt-bob"),
        stored([5], None, TOKENS[:4], PAGE, None, "GPU", "salt-bob", lora_name="a"),
    ], [removed([2, 4, 5], "GPU")])
    assert (held(index, "alice"), held(index, "bob"), held(index, "bob", "a")) == (4, 4, 0)


def test_bigram_pages_give_their_first_tokens_and_pages_alike_are_one_block():
    stored, removed = release_0_5_22()
    pairs = [[t, t + 1] for t in TOKENS[:8]]
    other = [*pairs[:7], [107, 999]]  # the same tokens, another token after them
    index, events = follow([
        stored([1, 2], None, pairs, PAGE, None, "GPU", "salt-alice"),
        stored([3], 1, other[4:], PAGE, None, "GPU", "salt-alice"),
    ], [removed([2], "GPU")])
    assert events[0].bigram and events[0].tokens == tuple(TOKENS[:8])
    assert held(index, "alice") == 8  # page 2 stands while SGLang holds one of its two
    index, _ = follow([stored([1, 2], None, pairs, PAGE, None, "GPU", "salt-alice"),
                       stored([3], 1, other[4:], PAGE, None, "GPU", "salt-alice")],
                      [removed([2, 3], "GPU")])
    assert held(index, "alice") == 4


def test_bigram_pairs_that_do_not_chain_are_malformed():
    stored, _ = release_0_5_22()
    broken = [[100, 101], [102, 103], [103, 104], [104, 105]]
    payload = msgspec.msgpack.encode(
        Batch(1.0, [stored([1], None, broken, PAGE, None, "GPU", "salt-alice")], 0))
    batch = decode_batch(0, payload)
    assert (batch.events, batch.num_malformed) == ((), 1)
