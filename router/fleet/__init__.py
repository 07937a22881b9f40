"""Who the workers are and what they hold: the registry and its readiness probes, the
run-time key rule, and (``events``) each worker's KV event stream into the index."""
