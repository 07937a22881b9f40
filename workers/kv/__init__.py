"""Worker KV memory: capacity planning, paged KV tensors, the block pool, the prefix
cache over the worker's RadixTree, KV events, and the engine-facing manager; the
tiers below the device (host memory, disk) are in ``tiers``.

See docs/kv-cache.md for the slot-payload model, the copy-on-write rule and the
invariants.
"""
