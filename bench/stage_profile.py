"""Where a router process spends its CPU, by request stage, measured live.

``python -m bench.stage_profile OUT.json ARGS...`` runs ``router.cli.main(ARGS)`` (the
real router, unchanged) with a sampling thread beside it: every millisecond the
thread reads the main thread's CPU clock and charges the CPU used since the last
sample to the stage of the main thread's current Python stack. The stage is that of
the innermost frame that names one (``STAGES``: a module, or a module's function); a
stack that names none is the HTTP server and event loop (``http+loop``); the CPU of other threads is ``OFF_LOOP``. The totals
(CPU seconds by stage) are rewritten to OUT.json every 200 ms, so a caller takes the
difference over a run. No code in the router knows it is measured; the sampler's own
CPU is on its own thread and not charged to any stage.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

# (path suffix, function or None for the whole module) -> stage; innermost match wins.
STAGES: dict[tuple[str, str | None], str] = {
    ("router/front/requests.py", None): "parse",
    ("radix/openai/requests.py", None): "parse",
    ("router/server/slow_clients.py", None): "parse",
    ("router/front/auth.py", None): "auth",
    ("router/front/tokenization.py", None): "tokenize",
    ("radix/token_cache.py", None): "tokenize",
    ("radix/openai/prompt.py", None): "tokenize",
    ("router/front/limits.py", None): "limits",
    ("router/server/dispatch.py", "match"): "match",
    ("router/routing/index/", None): "match",
    ("router/server/dispatch.py", "choose"): "choose",
    ("router/routing/policy.py", None): "choose",
    ("router/routing/load_cost.py", None): "choose",
    ("router/server/dispatch.py", "forward"): "forward",
    ("router/upstream/attempt.py", "post"): "forward",
    ("router/upstream/proxy.py", "generate_body"): "forward",
    ("router/upstream/relay.py", None): "relay",
    ("router/upstream/proxy.py", "_relay_stream"): "relay",
    ("router/upstream/attempt.py", "line_batches"): "relay",
    ("router/upstream/attempt.py", "sse_batches"): "relay",
    ("router/server/dispatch.py", "learn"): "learn",
    ("router/server/metrics.py", None): "metrics",
    ("prometheus_client/", None): "metrics",
    ("logging/__init__.py", None): "access log",
}
# CPU of threads other than the main one and the sampler: the executor that
# tokenizes long prompts off the event loop (``router.server.dispatch.tokenize``).
OFF_LOOP = "tokenize (threads)"
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


def sample(main_id: int, out: Path) -> None:
    """Charge the main thread's CPU to stages until the process exits."""
    clock = time.pthread_getcpuclockid(main_id)
    totals: dict[str, float] = {}
    last_cpu = time.clock_gettime(clock)
    last_others = time.process_time() - last_cpu - time.thread_time()
    last_write = time.monotonic()
    while True:
        time.sleep(INTERVAL_S)
        frame = sys._current_frames().get(main_id)
        cpu = time.clock_gettime(clock)
        others = time.process_time() - cpu - time.thread_time()
        stage = stage_of(frame) if frame is not None else "http+loop"
        totals[stage] = totals.get(stage, 0.0) + cpu - last_cpu
        totals[OFF_LOOP] = totals.get(OFF_LOOP, 0.0) + others - last_others
        last_cpu, last_others = cpu, others
        if time.monotonic() - last_write > WRITE_EVERY_S:
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(totals))
            os.replace(tmp, out)
            last_write = time.monotonic()


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

    threading.Thread(target=sample, args=(threading.main_thread().ident, out),
                     daemon=True).start()
    return router_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
