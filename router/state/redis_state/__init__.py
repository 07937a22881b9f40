"""Tenant counters on Redis for several routers (``limits``), over one connection with
retries (``link``), with the key schema (``keys``) and the Lua scripts (``scripts``)
that every Redis user of the router shares."""
