"""Real processes on loopback for the tests and the benchmarks: demo and timed workers,
routers, ``redis-server`` (through ``router.up.launcher``) and real vLLM CPU servers;
and the reader of their server-sent event streams (``harness.sse``). Never imported by
product code."""
