"""Decode graphs on the CPU: buckets, padding and static buffers, replayed eagerly.

``EagerCapture`` runs the very step function ``CudaGraphCapture`` records, over the
same static buffers, so these tests check what a GPU replays: which bucket a batch
takes, that padding rows store no K/V and change no real row, that the packed
buffer is rebuilt from each batch alone, and which batches stay eager.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.workers.model.hf_checkpoints import new_caches
from workers.model.decode_graphs import DecodeGraphs, EagerCapture, capture_sizes
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import load_model
from workers.model.runner import GraphPlan, ModelRunner
from workers.model.step_input import StepInput

BLOCK_SIZE = 4
NUM_BLOCKS = 40
MAX_MODEL_LEN = 32  # 8 blocks a sequence


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(ensure_demo_checkpoint(tmp_path_factory.mktemp("cache"))).model


class CountingCapture(EagerCapture):
    """An eager capture that records which bucket each replay ran."""

    def __init__(self) -> None:
        self.captured: list[int] = []
        self.replayed: list[int] = []

    def capture(self, step):
        size = len(self.captured)
        self.captured.append(size)

        def replay():
            self.replayed.append(size)
            return step()

        return replay


def runners(model, max_num_seqs: int = 8) -> tuple[ModelRunner, ModelRunner]:
    """(graphed, eager) runners over separate but identical caches."""
    graphed = ModelRunner(model, *new_caches(model, NUM_BLOCKS, BLOCK_SIZE), BLOCK_SIZE,
                          graphs=GraphPlan(EagerCapture(), max_num_seqs, MAX_MODEL_LEN))
    eager = ModelRunner(model, *new_caches(model, NUM_BLOCKS, BLOCK_SIZE), BLOCK_SIZE)
    return graphed, eager


@pytest.mark.parametrize(("max_num_seqs", "sizes"), [
    (1, (1,)), (3, (1, 2, 4)), (16, (1, 2, 4, 8, 16)), (20, (1, 2, 4, 8, 16, 32)),
    (64, (1, 2, 4, 8, 16, 32, 48, 64)),
])
def test_buckets_are_powers_of_two_to_16_then_multiples_of_16(max_num_seqs, sizes):
    assert capture_sizes(max_num_seqs) == sizes


def test_every_bucket_is_captured_once_largest_first_and_a_batch_takes_the_smallest(model):
    capture = CountingCapture()
    graphs = DecodeGraphs(lambda ids, metadata, runs: ids.float()[:, None], capture, max_num_seqs=20,
                          max_blocks_per_seq=2, block_size=4, num_blocks=8,
                          device=torch.device("cpu"))
    assert graphs.sizes == (1, 2, 4, 8, 16, 32)
    assert len(capture.captured) == 6  # bucket 32 first: index 0
    for batch_size, bucket_index in ((1, 5), (3, 3), (16, 1), (17, 0), (20, 0)):
        batch = [StepInput([7 + row], 2, [row % 8]) for row in range(batch_size)]
        out = graphs.execute(batch)
        assert capture.replayed[-1] == bucket_index
        assert out.flatten().tolist() == [7.0 + row for row in range(batch_size)]


def test_adapter_rows_are_one_run_each_and_replay_the_adapter_graphs():
    capture = CountingCapture()
    seen = []

    def decode(ids, metadata, runs):
        seen.append(None if runs is None else
                    (runs.starts.tolist(), runs.ends.tolist(), runs.slots.tolist()))
        return ids.float()[:, None]

    graphs = DecodeGraphs(decode, capture, max_num_seqs=4, max_blocks_per_seq=2, block_size=4,
                          num_blocks=8, device=torch.device("cpu"), adapters=True)
    assert len(capture.captured) == 6  # buckets 4, 2, 1 without adapters, then with
    seen.clear()
    graphs.execute([StepInput([5], 0, [1], 3), StepInput([6], 0, [2]), StepInput([7], 0, [3], 1)])
    assert capture.replayed[-1] == 3  # bucket 4 with adapters
    assert seen[-1] == ([0, 1, 2, 3], [1, 1, 3, 3], [3, 0, 1, 0])  # [1, 1) and [3, 3): empty
    graphs.execute([StepInput([5], 0, [1]), StepInput([6], 0, [2])])
    assert capture.replayed[-1] == 1 and seen[-1] is None  # bucket 2, base model only


def prefill(graphed: ModelRunner, eager: ModelRunner, prompts: list[list[int]],
            tables: list[list[int]]) -> None:
    for runner in (graphed, eager):
        runner.execute([StepInput(prompt, 0, table)
                        for prompt, table in zip(prompts, tables, strict=True)])


def test_a_decode_step_replayed_equals_the_eager_step_and_padding_stores_nothing(model):
    graphed, eager = runners(model)
    rng = random.Random(3)
    blocks = rng.sample(range(1, NUM_BLOCKS), 24)  # block 0 only ever backs padding
    prompts = [[rng.randrange(1, 300) for _ in range(length)] for length in (5, 9, 2)]
    tables = [blocks[0:4], blocks[4:8], blocks[8:12]]
    prefill(graphed, eager, prompts, tables)
    lengths = [len(p) for p in prompts]
    for _ in range(6):
        batch = [StepInput([rng.randrange(1, 300)], lengths[row], tables[row])
                 for row in range(3)]
        got, want = graphed.execute(batch), eager.execute(batch)
        assert got.shape == want.shape == (3, 320)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
        assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
        lengths = [length + 1 for length in lengths]
    for x, y in zip(graphed.caches, eager.caches, strict=True):
        torch.testing.assert_close(x.key, y.key, rtol=0, atol=1e-5)
        torch.testing.assert_close(x.value, y.value, rtol=0, atol=1e-5)
        assert not x.key[0].any() and not x.value[0].any()  # padding slots untouched


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_any_decode_batch_matches_eager(model, data):
    graphed, eager = runners(model)
    num_seqs = data.draw(st.integers(1, 8))
    blocks = data.draw(st.permutations(range(1, NUM_BLOCKS)))
    lengths = data.draw(st.lists(st.integers(1, MAX_MODEL_LEN - 1), min_size=num_seqs,
                                 max_size=num_seqs))
    tables, taken = [], 0
    for length in lengths:
        needed = length // BLOCK_SIZE + 1  # room for the decode token
        tables.append(blocks[taken:taken + needed])
        taken += needed
    if taken > len(blocks):
        return
    prompts = [[(7 * row + i) % 300 + 1 for i in range(length)]
               for row, length in enumerate(lengths)]
    prefill(graphed, eager, prompts, tables)
    batch = [StepInput([row + 5], lengths[row], tables[row]) for row in range(num_seqs)]
    torch.testing.assert_close(graphed.execute(batch), eager.execute(batch), rtol=0, atol=1e-4)


def test_batches_graphs_do_not_hold_run_eagerly(model):
    capture = CountingCapture()
    graphed = ModelRunner(model, *new_caches(model, NUM_BLOCKS, BLOCK_SIZE), BLOCK_SIZE,
                          graphs=GraphPlan(capture, 4, MAX_MODEL_LEN))
    assert graphed.graphs is not None
    graphed.execute([StepInput([1, 2, 3], 0, [1])])  # a prefill
    graphed.execute([StepInput([1], 3, [1]), StepInput([4, 5], 0, [2])])  # mixed
    graphed.execute([StepInput([1], 0, [row + 1]) for row in range(5)])  # 5 > bucket 4
    graphed.execute([StepInput([1], 0, list(range(1, 10)))])  # 9 blocks > 8
    assert capture.replayed == []
    graphed.execute([StepInput([1], 3, [1])])
    assert capture.replayed == [2]  # bucket 1 (captured third: 4, 2, 1)
    assert not graphed.graphs.runs([StepInput([1], 3, [1], lora_slot=0)])


def test_bad_tables_are_refused_before_anything_is_written(model):
    graphed, _ = runners(model)
    before = [cache.key.clone() for cache in graphed.caches]
    with pytest.raises(ValueError, match="cannot hold 5 tokens"):
        graphed.execute([StepInput([1], 4, [3])])
    with pytest.raises(ValueError, match="outside"):
        graphed.execute([StepInput([1], 0, [2]), StepInput([1], 0, [NUM_BLOCKS])])
    assert all(torch.equal(a, b.key) for a, b in zip(before, graphed.caches, strict=True))


def test_a_worker_captures_on_cuda_unless_told_to_stay_eager():
    from workers.build import decode_graphs
    from workers.cli import _parser, config_from_args
    from workers.config import WorkerConfig
    from workers.model.decode_graphs import CudaGraphCapture

    eager = config_from_args(_parser().parse_args(["--enforce-eager"]))
    assert eager.model.enforce_eager and not WorkerConfig().model.enforce_eager
    assert decode_graphs(eager, torch.device("cuda")) is None
    assert isinstance(decode_graphs(WorkerConfig(), torch.device("cuda")), CudaGraphCapture)
    assert decode_graphs(WorkerConfig(), torch.device("cpu")) is None
