"""The worker: paged KV cache, model, attention kernels, engine and HTTP server."""
