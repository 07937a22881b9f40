"""Sending a request to a worker: the proxy (retry before the first byte, resume
after it), the streamed relay, one upstream attempt, the keep-alive pool, and the
masking of what an OpenAI backend may see."""
