"""Where the blocks a request's worker lacks come from: its device, its own tiers, a
peer's pool (pulled) or a recompute, by one cost model (docs/router-index.md, "Where
the missing blocks come from")."""
