"""Property test: random programs over the KV cache manager keep every invariant.

Programs admit prompts drawn from a 3-token alphabet (so prefixes collide, often in
the middle of a block), some behind a 2-block public prefix (or 1.5 blocks of it not
registered as public, so a tenant diverges inside a public node), then compute tokens
(prefill chunks and decodes with fresh tokens), fork, commit whole blocks or
everything, finish, cancel, and evict, over a 14-block pool of 4-token blocks (so
admission and appends evict and sometimes fail). A fake model writes, for each
position, K/V that depend on the whole prefix; after every step each live sequence
must read its own prefix's K/V at every computed position, so a block written
while shared, a wrong prefix-hit mapping or a bad copy is caught.

After every step: the manager's invariants (pool, tree, locks, refcounts; no block
both free and referenced; no lock pins a block that no sequence holds, so evicting
everything would free every unreferenced block), and the event log replayed into a fresh consumer agrees
with the worker's tree (see ``assert_replay_equivalent``; the workload splits nodes
mid-block, so the conservative rule applies). At teardown everything is freed or
cancelled: no block is in use, every block is free or cached, and evicting all
leaves empties the cache and the replay.

The host-tier machine runs the same programs with a small host tier (evictions
demote full blocks, admissions restore them, ``swap_out`` preempts by swapping):
restored blocks must read back exactly, the host events replay to exactly the
tier's contents, and the tier never holds more than its capacity.

Liveness: whenever no sequence is live, a prompt that fits the pool is admitted
(``finish_all_then_admit``). The tiny-pool machine runs the same programs over a pool only a
few blocks larger than the longest prompt, so admission evicts or fails on most
steps and mid-block hits must give up their partial block to fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radix.keys import to_key
from radix.tree import PUBLIC
from tests.workers.kv.kv_test_support import (
    EventConsumer,
    assert_reads,
    assert_replay_equivalent,
    make_manager,
    write_kv,
)
from workers.kv.tiers.host_link import HostLink

BLOCK_SIZE = 4
NUM_BLOCKS = 14
ALPHABET = (1, 2, 3)
PUBLIC_PROMPT = (7, 8, 9, 7, 8, 9, 7, 8)
BASES = (
    (),
    (1, 2, 3, 1, 2),
    (1, 2, 3, 1, 2, 3, 1, 2, 3),
    (1, 2, 3, 1, 2, 3, 3),
    (2, 2, 1, 3, 3, 1),
    (1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3),
    (1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3),  # long, diverging from the others at 1
)
PROMPTS = st.builds(
    lambda base, suffix: [*base, *suffix],
    st.sampled_from(BASES),
    st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=4),
)
ADMIT_ARGS = {
    "prompt": PROMPTS,
    # -1: the first 6 public-prompt tokens, not registered as public (num_public 0): the
    # tenant's insert then splits a PUBLIC node in the middle of a block.
    "num_public_blocks": st.sampled_from((0, 0, 1, 2, -1)),
    "scope": st.sampled_from(("t1", "t2", "t1")),
}


@dataclass
class Model:
    """What the test knows about one live sequence."""

    tokens: list[int]
    num_computed: int
    prompt_len: int
    scope: str
    num_public: int
    reserved: bool  # the prompt's blocks are still exclusively its own (no fork/partial commit)


class KVManagerMachine(RuleBasedStateMachine):
    num_blocks = NUM_BLOCKS
    num_host_blocks = 0

    def __init__(self) -> None:
        super().__init__()
        self.manager = make_manager(self.num_blocks, BLOCK_SIZE,
                                    num_host_blocks=self.num_host_blocks)
        self.cache = self.manager.prefix_cache
        self.consumer = EventConsumer(BLOCK_SIZE)
        self.consumer.apply(self.manager.event_log.since(-1, self.manager.event_log.epoch))
        self.seqs: dict[int, Model] = {}
        self.next_id = 0
        self.committed: set[tuple[str, tuple[int, ...]]] = set()  # (scope, tokens) ever cached

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _admit(self, prompt: list[int], num_public_blocks: int, scope: str) -> int | None:
        num_public = max(0, num_public_blocks) * BLOCK_SIZE
        num_prefix = 6 if num_public_blocks < 0 else num_public
        tokens = [*PUBLIC_PROMPT[:num_prefix], *prompt]
        seq_id = self._new_id()
        used_before = self.manager.pool.num_used_blocks
        num_cached = self.manager.admit(seq_id, tokens, scope, num_public)
        if num_cached is None:
            assert self.manager.pool.num_used_blocks == used_before
            return None
        assert 0 <= num_cached <= len(tokens) - 1
        assert self.manager.num_computed_tokens(seq_id) == num_cached
        hit = tuple(tokens[:num_cached])
        assert not hit or any(
            scope_ in (scope, PUBLIC) and cached[:num_cached] == hit
            for scope_, cached in self.committed
        ), "a prefix hit that no commit of this tenant or the public could have made"
        assert_reads(self.manager, seq_id, tokens, num_cached)
        self.seqs[seq_id] = Model(tokens, num_cached, len(tokens), scope, num_public, reserved=True)
        return seq_id

    @rule(**ADMIT_ARGS)
    def admit(self, prompt: list[int], num_public_blocks: int, scope: str) -> None:
        self._admit(prompt, num_public_blocks, scope)

    @rule(**ADMIT_ARGS)
    def finish_all_then_admit(self, prompt: list[int], num_public_blocks: int, scope: str) -> None:
        """Liveness: with nothing else live, a prompt that fits the pool is admitted."""
        for seq_id in sorted(self.seqs):
            self._commit(seq_id, self.seqs[seq_id].num_computed, whole_list=True)
            del self.seqs[seq_id]
            self.manager.free(seq_id)
        assert self._admit(prompt, num_public_blocks, scope) is not None, "stalled alone"

    @rule(data=st.data(), num_decode=st.integers(0, 3), **ADMIT_ARGS)
    def serve(
        self,
        data: st.DataObject,
        num_decode: int,
        prompt: list[int],
        num_public_blocks: int,
        scope: str,
    ) -> None:
        """A whole request: admit, prefill, commit whole blocks, decode, finish."""
        seq_id = self._admit(prompt, num_public_blocks, scope)
        if seq_id is None:
            return
        seq = self.seqs[seq_id]
        self._compute(seq_id, seq.prompt_len - seq.num_computed, data)
        self._commit(seq_id, seq.num_computed - seq.num_computed % BLOCK_SIZE)
        for _ in range(num_decode):
            if not self._compute(seq_id, 1, data):
                break
        self._commit(seq_id, seq.num_computed)
        self.manager.free(seq_id)
        del self.seqs[seq_id]

    def _commit(self, seq_id: int, count: int, whole_list: bool = False) -> None:
        """Commit and check that the public part is now public (if not evicted since)."""
        seq = self.seqs[seq_id]
        if whole_list:
            self.manager.commit(seq_id, seq.tokens[:count])
        else:
            self.manager.commit(seq_id, seq.tokens, count)
        num_public = min(seq.num_public, count)
        self.committed.add((PUBLIC, tuple(seq.tokens[:num_public])))
        self.committed.add((seq.scope, tuple(seq.tokens[:count])))
        public_key = to_key(seq.tokens[:num_public])
        assert (
            self.cache.tree.match(public_key, PUBLIC, touch=False).num_matched_tokens == num_public
        )

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), num_new=st.integers(1, 6))
    def compute(self, data: st.DataObject, num_new: int) -> None:
        self._compute(data.draw(st.sampled_from(sorted(self.seqs))), num_new, data)

    def _compute(self, seq_id: int, num_new: int, data: st.DataObject) -> bool:
        """Prefill or decode ``num_new`` positions (new tokens drawn past the prompt)."""
        seq = self.seqs[seq_id]
        start, end = seq.num_computed, seq.num_computed + num_new
        table_before = self.manager.block_table(seq_id)
        if not self.manager.append_slots(seq_id, num_new):
            assert not (seq.reserved and end <= seq.prompt_len), "reserved prompt slots failed"
            assert self.manager.block_table(seq_id) == table_before
            assert self.manager.num_computed_tokens(seq_id) == start
            return False
        while len(seq.tokens) < end:
            seq.tokens.append(data.draw(st.sampled_from(ALPHABET)))
        write_kv(self.manager, seq_id, seq.tokens, start, end)
        seq.num_computed = end
        assert self.manager.num_computed_tokens(seq_id) == end
        return True

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent_id = data.draw(st.sampled_from(sorted(self.seqs)))
        parent = self.seqs[parent_id]
        child_id = self._new_id()
        self.manager.fork(parent_id, child_id)
        parent.reserved = False
        self.seqs[child_id] = Model(
            list(parent.tokens),
            parent.num_computed,
            parent.prompt_len,
            parent.scope,
            parent.num_public,
            reserved=False,
        )

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), whole_blocks=st.booleans())
    def commit(self, data: st.DataObject, whole_blocks: bool) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.seqs)))
        seq = self.seqs[seq_id]
        count = (
            seq.num_computed - seq.num_computed % BLOCK_SIZE if whole_blocks else seq.num_computed
        )
        if count % BLOCK_SIZE:
            seq.reserved = False
        self._commit(seq_id, count)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.seqs)))
        self._commit(seq_id, self.seqs[seq_id].num_computed, whole_list=True)
        del self.seqs[seq_id]
        self.manager.free(seq_id)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.seqs)))
        del self.seqs[seq_id]
        self.manager.free(seq_id)
        self.manager.free(seq_id)  # freeing twice is a no-op

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        """Preemption by swapping: cache what was computed, free, evict own leaves."""
        seq_id = data.draw(st.sampled_from(sorted(self.seqs)))
        seq = self.seqs.pop(seq_id)
        free_before = self.manager.pool.num_free_blocks
        self.manager.swap_out(seq_id, seq.tokens)
        self.committed.add((seq.scope, tuple(seq.tokens[: seq.num_computed])))
        self.committed.add((PUBLIC, tuple(seq.tokens[: min(seq.num_public, seq.num_computed)])))
        assert self.manager.pool.num_free_blocks >= free_before

    @rule(num_blocks=st.integers(1, 4))
    def evict(self, num_blocks: int) -> None:
        free_before = self.manager.pool.num_free_blocks
        freed = self.cache.evict(num_blocks)
        assert self.manager.pool.num_free_blocks == free_before + freed

    @invariant()
    def consistent(self) -> None:
        self.manager.check_invariants()
        for node in self.cache.tree.iter_nodes():
            if node.scope == PUBLIC:
                assert to_key(PUBLIC_PROMPT).startswith(self.cache.tree.path_key(node)), node
        for seq_id, seq in self.seqs.items():
            assert_reads(self.manager, seq_id, seq.tokens, seq.num_computed)
        log = self.manager.event_log
        self.consumer.apply(log.since(self.consumer.last_seq, log.epoch))
        assert_replay_equivalent(self.cache.tree, self.consumer, exact=False)
        tiers = self.cache.tiers
        held = tiers.host.entries() if isinstance(tiers, HostLink) else []
        assert len(held) <= self.num_host_blocks
        assert self.consumer.host_hashes == {block_hash.hex() for block_hash, _ in held}

    def teardown(self) -> None:
        for seq_id in list(self.seqs):
            self.manager.free(seq_id)
        pool = self.manager.pool
        self.manager.check_invariants()
        assert pool.num_used_blocks == 0
        assert pool.num_free_blocks + pool.num_cached_blocks == self.num_blocks
        self.cache.evict(self.num_blocks)
        assert pool.num_free_blocks == self.num_blocks
        assert self.cache.tree.num_nodes == 0 and self.cache.num_cached_tokens == 0
        log = self.manager.event_log
        self.consumer.apply(log.since(self.consumer.last_seq, log.epoch))
        assert self.consumer.blocks == {}


def machine_settings(max_examples: int, stateful_step_count: int) -> settings:
    """Hypothesis settings for a state machine run (no deadline: steps vary a lot)."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=stateful_step_count,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


KVManagerMachine.TestCase.settings = machine_settings(500, 25)
test_kv_manager_state_machine = KVManagerMachine.TestCase


class TinyPoolMachine(KVManagerMachine):
    num_blocks = 7  # the longest prompt (24 tokens) needs 6


TinyPoolMachine.TestCase.settings = machine_settings(300, 40)
test_kv_manager_state_machine_tiny_pool = TinyPoolMachine.TestCase


class HostTierMachine(KVManagerMachine):
    num_host_blocks = 10


HostTierMachine.TestCase.settings = machine_settings(300, 30)
test_kv_manager_state_machine_host_tier = HostTierMachine.TestCase
