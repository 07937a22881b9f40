"""State several routers share: tenant limits, the worker registry, public prefixes
and routed inserts, in process (one router) or in Redis."""
