"""The per-request trace: one JSON line per finished request on logger ``worker.trace``.

Fields: ``request_id`` (the caller's, e.g. the router's ``X-Request-Id``, else the
engine's number), ``kv_dtype``, ``prompt_tokens``, ``completion_tokens``,
``cached_tokens`` by medium (``device``, ``host``: the prompt tokens its first
admission found cached, and where they were), ``evicted_blocks`` (cached blocks
its admissions evicted to make room for it), ``preemptions`` (times one of its
sequences was preempted) and ``finish_reasons`` (one per choice). The router's
``router.access`` line carries the same request id, the chosen worker and the
predicted match, so the two join on it. Nothing of the prompt or the output is
logged.
"""

from __future__ import annotations

import json
import logging

from workers.engine.sequence import RequestState

trace_log = logging.getLogger("worker.trace")


def trace_record(state: RequestState, kv_dtype: str) -> dict[str, object]:
    """The trace fields of a finished request (see the module docstring)."""
    num_cached = min(state.num_cached_tokens or 0, state.num_prompt_tokens)
    num_host = min(state.num_host_cached_tokens, num_cached)
    request = state.request
    return {
        "request_id": request.request_id if request.request_id is not None else state.request_id,
        "kv_dtype": kv_dtype,
        "prompt_tokens": state.num_prompt_tokens,
        "completion_tokens": state.num_completion_tokens(),
        "cached_tokens": {"device": num_cached - num_host, "host": num_host},
        "evicted_blocks": state.num_admission_evicted_blocks,
        "preemptions": state.num_preemptions,
        "finish_reasons": [seq.finish_reason for seq in state.sequences],
    }


def log_finished(state: RequestState, kv_dtype: str) -> None:
    """Write the trace line of a finished request (when INFO is on for the logger)."""
    if trace_log.isEnabledFor(logging.INFO):
        trace_log.info(json.dumps(trace_record(state, kv_dtype), separators=(",", ":")))
