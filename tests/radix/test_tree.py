"""Exact outcomes of RadixTree operations: splits, payloads, eviction order, scopes."""

from array import array

import pytest

from radix.keys import from_key, to_key
from radix.tree import PUBLIC, RadixTree


def slots_tree() -> RadixTree:
    """The worker's shape: payload = one slot id per token, split by slicing."""
    return RadixTree(split_payload=lambda slots, n: (slots[:n], slots[n:]))


def put(tree: RadixTree, tokens: list[int], scope: str = "t", first_slot: int = 0):
    result = tree.insert(to_key(tokens), scope)
    for node in result.new_nodes:
        node.payload = array("i", range(first_slot + node.start, first_slot + node.end))
    return result


def test_insert_splits_payload_at_the_divergence():
    tree = slots_tree()
    put(tree, [1, 2, 3, 4, 5])
    result = put(tree, [1, 2, 9], first_slot=100)
    assert result.num_existing_tokens == 2
    head, leaf = result.nodes
    assert from_key(head.key) == [1, 2] and list(head.payload) == [0, 1]
    assert list(leaf.payload) == [102]
    (tail,) = [c for c in head.children.values() if c is not leaf]
    assert from_key(tail.key) == [3, 4, 5] and list(tail.payload) == [2, 3, 4]
    tree.check_invariants()


def test_insert_of_a_present_prefix_adds_a_boundary_and_nothing_else():
    tree = slots_tree()
    put(tree, [1, 2, 3, 4])
    result = tree.insert(to_key([1, 2]), "t")
    assert result.num_existing_tokens == 2 and result.new_nodes == ()
    assert result.nodes[-1].end == 2
    assert tree.num_tokens("t") == 4


def test_match_is_token_granular_and_does_not_split():
    tree = slots_tree()
    put(tree, [1, 2, 3, 4])
    match = tree.match(to_key([1, 2, 3, 9]), "t")
    assert match.num_matched_tokens == 3
    assert tree.num_nodes == 1


def test_eviction_is_lru_over_unlocked_leaves_and_cascades():
    tree = slots_tree()
    a = put(tree, [1, 1, 1]).nodes[-1]
    b = put(tree, [1, 1, 2]).nodes[-1]  # splits: [1,1] -> {[1], [2]}
    c = put(tree, [3, 3]).nodes[-1]
    tree.match(to_key([1, 1, 1]), "t")  # a is now the most recent
    evicted = tree.evict(1)
    assert evicted == [b]
    evicted = tree.evict(1)
    assert evicted == [c]
    evicted = tree.evict(10)
    assert [from_key(n.key) for n in evicted] == [[1], [1, 1]]
    assert evicted[0] is a and tree.num_nodes == 0


def test_locked_path_survives_and_unlock_counts_as_use():
    tree = slots_tree()
    a = put(tree, [1, 2]).nodes[-1]
    b = put(tree, [5, 6]).nodes[-1]
    tree.lock(a)
    assert tree.evict(100) == [b]
    assert tree.match(to_key([1, 2]), "t").num_matched_tokens == 2
    tree.unlock(a)
    assert tree.evict(100) == [a]
    with pytest.raises(ValueError):
        tree.unlock(a)


def test_split_head_inherits_the_lock():
    tree = slots_tree()
    a = put(tree, [1, 2, 3]).nodes[-1]
    tree.lock(a)
    head = put(tree, [1, 9]).nodes[0]
    assert head.lock_ref == 1
    assert [from_key(n.key) for n in tree.evict(100)] == [[9]]
    tree.unlock(a)
    tree.check_invariants()


def test_tenants_never_see_each_other_but_both_see_public():
    tree = slots_tree()
    put(tree, [7, 7, 7, 7], scope=PUBLIC)
    put(tree, [7, 7, 7, 7, 1, 2, 3], scope="alice")
    assert tree.match(to_key([7, 7, 7, 7, 1, 2, 3]), "bob").num_matched_tokens == 4
    assert tree.match(to_key([7, 7, 7, 7, 1, 2, 3]), "alice").num_matched_tokens == 7
    put(tree, [5, 5], scope="alice")
    result = put(tree, [5, 5], scope="bob")
    assert result.num_existing_tokens == 0, "same text, other tenant: a separate sibling"
    assert tree.num_tokens("alice") == 5 and tree.num_tokens("bob") == 2
    assert tree.num_tokens(PUBLIC) == 4


def test_public_and_own_sibling_with_the_same_first_token_take_the_longer():
    tree = slots_tree()
    put(tree, [1, 2, 8], scope="alice")
    put(tree, [1, 2, 3, 4], scope=PUBLIC)
    assert tree.match(to_key([1, 2, 3, 4]), "alice").num_matched_tokens == 4
    assert tree.match(to_key([1, 2, 8]), "alice").num_matched_tokens == 3


def test_remove_leaf_rejects_inner_and_locked_nodes():
    tree = slots_tree()
    put(tree, [1, 2])
    leaf = put(tree, [1, 3]).nodes[-1]
    head = leaf.parent
    with pytest.raises(ValueError):
        tree.remove_leaf(head)
    tree.lock(leaf)
    with pytest.raises(ValueError):
        tree.remove_leaf(leaf)
    tree.unlock(leaf)
    tree.remove_leaf(leaf)
    assert tree.path_key(leaf) == to_key([1, 3])
    tree.check_invariants()
