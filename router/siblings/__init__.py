"""What several routers of one deployment share beyond counters: the worker registry,
public prefixes, canary weights and approximate routing decisions (``protocol`` is the
interface, ``redis_siblings`` the Redis implementation, ``routed`` the decision stream)."""
