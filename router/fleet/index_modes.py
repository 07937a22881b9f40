"""How a ready worker is indexed: exactly, from its KV events, or approximately, from
what the router sent it, with the reason in ``GET /admin/workers``.

A follower task decides as it starts: the vLLM one on token parity
(``router.fleet.events.vllm.attach``), the radix one on the key mode of the worker's
cache namespace (``key_mode_problem``). The router's index cuts a prompt into blocks of
``block_size`` tokens and files each stored block under its own tokens; an engine whose
block keys cover more (SGLang's EAGLE keys a block by its tokens and the next one)
files blocks the index would match wrongly, so its events are refused: never read.
Its own namespace digest already keeps whatever it caches apart from every other
engine's (docs/protocol.md, Cache namespaces).
"""

from __future__ import annotations

import logging

from router.fleet.worker_state import WorkerState
from router.routing.index import RouterIndex, WorkerId

log = logging.getLogger(__name__)
MATCHED_KEY_MODES = ("",)


def key_mode_problem(worker: WorkerState) -> str | None:
    """Why ``worker``'s KV events cannot be indexed: a key mode of its namespace that
    the index does not match; None when they can (or the router builds its namespace)."""
    namespace = worker.cache_namespace
    if namespace is None or namespace.key_mode in MATCHED_KEY_MODES:
        return None
    return (f"its KV event keys are in key mode {namespace.key_mode!r}, which this router's "
            "index does not match: its events are not read")


def route_exactly(worker: WorkerState, index: RouterIndex) -> None:
    """Index ``worker`` from its KV events (undoing ``route_approximately``)."""
    worker.set_index_mode("exact", "")
    index.set_exact(WorkerId(worker.worker_id))


def route_approximately(worker: WorkerState, index: RouterIndex, problem: str) -> None:
    """Index ``worker`` from what the router sends it, for ``problem`` (logged, and
    shown in ``GET /admin/workers``)."""
    log.warning("worker %s routed approximately: %s", worker.worker_id, problem)
    worker.set_index_mode("approximate", problem)
    index.set_approximate(WorkerId(worker.worker_id))
