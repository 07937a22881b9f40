"""The workers: the registry and its readiness probes, each worker's KV event
stream into the index, and the proxy that serves a request on one worker."""
