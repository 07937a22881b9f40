"""The worker's aiohttp server: OpenAI-compatible and ``/generate`` routes, status,
metrics and the KV event stream (docs/protocol.md "Worker HTTP")."""
