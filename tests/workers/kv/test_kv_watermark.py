"""Decode headroom: admission leaves the watermark of blocks obtainable while other
sequences run, counting free and cached blocks, and never applies it to a lone
sequence."""

from __future__ import annotations

import pytest

from tests.workers.kv.kv_test_support import make_manager

B = 4


def tokens(num_blocks: int, first: int) -> list[int]:
    """A prompt filling ``num_blocks`` blocks exactly, distinct per ``first``."""
    return list(range(first, first + num_blocks * B))


@pytest.mark.parametrize(("watermark", "admitted"), [(0.0, True), (0.05, False)])
def test_admission_stops_at_the_watermark(watermark: float, admitted: bool):
    manager = make_manager(100, B, watermark=watermark)
    assert manager.num_watermark_blocks == int(watermark * 100)
    assert manager.admit(1, tokens(90, 1000), "t1") == 0
    assert manager.admit(2, tokens(5, 2000), "t1") == 0, "leaves 5 blocks: exactly the mark"
    assert manager.num_free_blocks == 5
    assert (manager.admit(3, tokens(1, 3000), "t1") is not None) is admitted
    manager.check_invariants()
    assert manager.num_free_blocks == (4 if admitted else 5), "a refusal holds nothing"


def test_cached_blocks_count_toward_the_watermark():
    manager = make_manager(100, B, watermark=0.05)
    cached = tokens(3, 4000)
    assert manager.admit(1, cached, "t1") == 0
    assert manager.append_slots(1, len(cached))
    manager.commit(1, cached)
    manager.free(1)
    assert manager.admit(2, tokens(92, 1000), "t1") == 0
    assert (manager.num_free_blocks, manager.pool.num_cached_blocks) == (5, 3)
    # 8 obtainable (5 free, 3 cached): taking 3 leaves the mark, taking 4 would not.
    assert manager.admit(3, tokens(4, 2000), "t1") is None
    assert manager.admit(4, tokens(3, 3000), "t1") == 0
    manager.check_invariants()


def test_a_lone_sequence_ignores_the_watermark():
    manager = make_manager(100, B, watermark=0.05)
    assert manager.admit(1, tokens(100, 1000), "t1") == 0
    assert manager.num_free_blocks == 0
    manager.check_invariants()


def test_the_watermark_is_a_fraction_below_one():
    with pytest.raises(ValueError, match="watermark"):
        make_manager(10, B, watermark=1.0)
