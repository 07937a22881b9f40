"""Where a router process spends its CPU, by request stage, measured live.

``python -m bench.stage_profile OUT.json ARGS...`` runs ``router.cli.main(ARGS)`` (the
real router, unchanged) under a CPU-time profiling timer: every millisecond of the
process's CPU (``ITIMER_PROF``) the ``SIGPROF`` handler charges one tick to the
stage of the main thread's current Python stack. The stage is that of the innermost
frame that names one (``STAGES``: a module, or a module's function); a stack that
names none is the HTTP server and event loop (``http+loop``). The totals (CPU seconds
by stage) are rewritten to OUT.json every 200 ms, so a caller takes the difference
over a run. No code in the router knows it is measured. Long prompts tokenized on
the executor's threads (``router.dispatch.tokenize``) are charged to whatever
the main thread runs meanwhile: the scenarios here tokenize on the loop.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

# (path suffix, function or None for the whole module) -> stage; innermost match wins.
STAGES: dict[tuple[str, str | None], str] = {
    ("router/front/requests.py", None): "parse",
    ("radix/openai/requests.py", None): "parse",
    ("router/server/slow_clients.py", None): "parse",
    ("router/front/auth.py", None): "auth",
    ("router/models.py", None): "tokenize",
    ("radix/token_cache.py", None): "tokenize",
    ("radix/openai/prompt.py", None): "tokenize",
    ("router/front/limits.py", None): "limits",
    ("router/dispatch.py", "match"): "match",
    ("router/routing/index/", None): "match",
    ("router/dispatch.py", "choose"): "choose",
    ("router/routing/policy.py", None): "choose",
    ("router/routing/load_cost.py", None): "choose",
    ("router/dispatch.py", "forward"): "forward",
    ("router/forward/attempt.py", "post"): "forward",
    ("router/forward/proxy.py", "generate_request"): "forward",
    ("router/forward/relay.py", None): "relay",
    ("router/forward/proxy.py", "_relay_stream"): "relay",
    ("router/forward/attempt.py", "line_batches"): "relay",
    ("router/forward/attempt.py", "sse_batches"): "relay",
    ("router/dispatch.py", "learn"): "learn",
    ("router/fleet/events/", None): "kv events",
    ("radix/events.py", None): "kv events",
    ("router/fleet/", None): "fleet polls",
    ("router/metrics.py", None): "metrics",
    ("prometheus_client/", None): "metrics",
    ("logging/__init__.py", None): "access log",
}
INTERVAL_S = 0.001
WRITE_EVERY_S = 0.2


def stage_of(frame) -> str:
    """The stage of a stack whose innermost frame is ``frame``."""
    while frame is not None:
        code = frame.f_code
        path = code.co_filename
        for (suffix, function), stage in STAGES.items():
            if suffix in path and (function is None or function == code.co_name):
                return stage
        frame = frame.f_back
    return "http+loop"


class Sampler:
    """Counts SIGPROF ticks (one per ``INTERVAL_S`` of the process's CPU) by the stage
    of the main thread's stack when the tick's handler runs: Python runs signal
    handlers on the main thread between bytecodes, so a tick that fell inside a C
    call (a tokenizer's encode, a socket write) is charged to the frame that made
    it, with no bias towards code that releases the GIL. A tick that fell in C code
    no Python frame called (the event loop's own work between two callbacks) is
    handled at the next bytecode, so it is charged to whatever Python code runs next,
    often a coroutine resuming after its ``await``: the HTTP stages (forward, relay,
    ``http+loop``) share the loop's work among them, and are best read together."""

    def __init__(self, out: Path) -> None:
        self._out = out
        self._ticks: dict[str, int] = {}
        self._last_write = time.monotonic()

    def start(self) -> None:
        """Install the handler and start the CPU-time timer."""
        signal.signal(signal.SIGPROF, self._tick)
        signal.setitimer(signal.ITIMER_PROF, INTERVAL_S, INTERVAL_S)

    def _tick(self, signum: int, frame) -> None:
        stage = stage_of(frame) if frame is not None else "http+loop"
        self._ticks[stage] = self._ticks.get(stage, 0) + 1
        now = time.monotonic()
        if now - self._last_write > WRITE_EVERY_S:
            self._last_write = now
            tmp = self._out.with_suffix(".tmp")
            tmp.write_text(json.dumps({s: n * INTERVAL_S for s, n in self._ticks.items()}))
            os.replace(tmp, self._out)


def read_totals(path: Path) -> dict[str, float]:
    """The latest totals written to ``path`` (empty before the first write)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def main() -> int:
    """Start the sampler, then run the router with the remaining arguments."""
    out = Path(sys.argv[1])
    from router.cli import main as router_main

    Sampler(out).start()
    return router_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
