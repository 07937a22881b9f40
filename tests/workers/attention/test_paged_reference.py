"""The torch reference paged attention against dense float64 attention, and the layout."""

from __future__ import annotations

import pytest
import torch

from tests.workers.attention.paged_cases import dense_attention, make_case
from workers.attention import reference
from workers.attention.metadata import AttentionMetadata


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (4, 2), (6, 1)])
def test_prefill_over_prefix_matches_dense(block_size, num_heads, num_kv_heads):
    case = make_case([5, 1, 17, 3], [30, 40, 0, 16], block_size, num_heads, num_kv_heads)
    out = reference.paged_prefill(
        case.query,
        case.key_cache,
        case.value_cache,
        case.metadata.query_start_loc,
        case.metadata.seq_lens,
        case.metadata.block_tables,
        case.metadata.max_query_len,
        case.scale,
    )
    torch.testing.assert_close(out.double(), dense_attention(case), rtol=0, atol=1e-5)


def test_decode_matches_dense():
    case = make_case([1, 1, 1], [0, 37, 63], 16, num_heads=8, num_kv_heads=2)
    out = reference.paged_decode(
        case.query,
        case.key_cache,
        case.value_cache,
        case.metadata.seq_lens,
        case.metadata.block_tables,
        case.scale,
    )
    torch.testing.assert_close(out.double(), dense_attention(case), rtol=0, atol=1e-5)


def test_stale_nan_slots_do_not_leak():
    case = make_case([3], [5], 16)
    length = 8
    table = case.block_tables[0]
    case.value_cache[table[0], length:] = float("nan")
    case.key_cache[table[0], length:] = float("nan")
    out = reference.paged_decode(
        case.query[:1],
        case.key_cache,
        case.value_cache,
        torch.tensor([length], dtype=torch.int32),
        case.metadata.block_tables,
        case.scale,
    )
    assert torch.isfinite(out).all()


def test_write_kv_stores_into_the_mapped_slots():
    key_cache = torch.zeros(4, 2, 1, 3)
    value_cache = torch.zeros(4, 2, 1, 3)
    key = torch.arange(6.0).reshape(2, 1, 3)
    reference.write_kv(key_cache, value_cache, key, -key, torch.tensor([5, 0]))
    assert key_cache[2, 1, 0].tolist() == [0.0, 1.0, 2.0]
    assert value_cache[0, 0, 0].tolist() == [-3.0, -4.0, -5.0]
    assert key_cache.count_nonzero() == 5


def test_metadata_layout_is_exact():
    metadata = AttentionMetadata.build([3, 1], [2, 5], [[7, 3], [1, 4]], 4, 8, "cpu")
    assert metadata.positions.tolist() == [2, 3, 4, 5]
    # seq 0: pos 2, 3 -> block 7; pos 4 -> block 3. seq 1: pos 5 -> block 4, offset 1.
    assert metadata.slot_mapping.tolist() == [30, 31, 12, 17]
    assert metadata.query_start_loc.tolist() == [0, 3, 4]
    assert metadata.seq_lens.tolist() == [5, 6]
    assert metadata.last_token_indices.tolist() == [2, 3]
    assert (metadata.max_query_len, metadata.max_seq_len) == (3, 6)


@pytest.mark.parametrize(
    ("query_lens", "computed", "tables", "message"),
    [
        ([0], [0], [[0]], "needs >= 1 new token"),
        ([5], [0], [[0]], "cannot hold 5 tokens"),
        ([1], [0], [[8]], "outside"),
        ([], [], [], "non-empty"),
    ],
)
def test_metadata_rejects_bad_batches(query_lens, computed, tables, message):
    with pytest.raises(ValueError, match=message):
        AttentionMetadata.build(query_lens, computed, tables, 4, 8, "cpu")
