"""Committing a sequence chunk by chunk (incremental: only the path below the previous
lock is scanned) leaves exactly the state of one commit of the whole prefix, and a key
commits exactly like its token ids."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radix.keys import to_key
from tests.workers.kv.kv_test_support import make_manager

B = 4


def _state(manager, seq_ids):
    """What the commits decided: every cached block (scope, chained hash, tokens; node
    boundaries aside, which chunking adds at block ends), block tables, block counts.
    The blocks each lock holds beyond its table are checked by ``check_invariants``."""
    _, events = manager.snapshot()
    stored = sorted({(e.scope, b.hash, b.tokens) for e in events for b in e.blocks})
    tables = {seq_id: manager.block_table(seq_id) for seq_id in seq_ids}
    stats = manager.stats()
    return stored, tables, stats.num_free_blocks, stats.num_cached_blocks, stats.num_cached_tokens


def _run(prompts, chunks, public, incremental, as_key):
    """Admit each prompt in turn (earlier ones stay live, so hits cross sequences),
    prefill it in ``chunks``-sized steps, committing whole blocks after each step
    (``incremental``) or only once at the end."""
    manager = make_manager(64, B)
    for seq_id, tokens in enumerate(prompts):
        num_public = min(public, len(tokens)) // B * B
        manager.admit(seq_id, to_key(tokens) if as_key else tokens, "t1", num_public)
        done = manager.num_computed_tokens(seq_id)
        while done < len(tokens):
            step = min(chunks, len(tokens) - done)
            assert manager.append_slots(seq_id, step)
            done += step
            if incremental and done >= B:
                whole = done - done % B
                manager.commit(seq_id, to_key(tokens[:whole]) if as_key else tokens[:whole])
                manager.check_invariants()
        manager.commit(seq_id, to_key(tokens) if as_key else tokens)
        manager.check_invariants()
    return _state(manager, range(len(prompts)))


prompt_sets = st.lists(
    st.tuples(st.integers(0, 2), st.lists(st.integers(0, 5), min_size=1, max_size=20)),
    min_size=1, max_size=4,
).map(lambda items: [[7] * (4 * shared) + tail for shared, tail in items])  # shared prefixes


@settings(max_examples=60, deadline=None)
@given(prompt_sets, st.integers(1, 9), st.sampled_from([0, 4, 8]), st.booleans())
def test_chunked_commits_equal_one_commit(prompts, chunks, public, as_key):
    one = _run(prompts, chunks, public, incremental=False, as_key=as_key)
    assert _run(prompts, chunks, public, incremental=True, as_key=as_key) == one
    assert _run(prompts, chunks, public, incremental=True, as_key=not as_key) == one


def test_a_repeated_commit_adds_nothing_and_a_key_needs_its_computed_tokens():
    manager = make_manager(8, B)
    tokens = list(range(10))
    manager.admit(1, to_key(tokens), "t1")
    manager.append_slots(1, 8)
    manager.commit(1, to_key(tokens[:8]))
    head = manager.event_log.head_seq
    manager.commit(1, to_key(tokens[:8]))
    assert manager.event_log.head_seq == head
    try:
        manager.commit(1, to_key(tokens))
    except ValueError as exc:
        assert "cannot commit 10 tokens" in str(exc)
    else:
        raise AssertionError("committed tokens that were not computed")
    manager.check_invariants()
