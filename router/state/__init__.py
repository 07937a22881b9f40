"""Tenant counters (concurrency, tokens per minute) kept in process for one router, or
in Redis for several (``redis_state``, with the link and scripts both use)."""
