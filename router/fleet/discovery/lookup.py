"""``ModelLookups``: the model of each discovered endpoint without a model label, asked
of the pod's ``/v1/models``, every lookup in its own task.

A pod that accepts and never answers holds only its own lookup (each attempt ends
after ``timeout_s``, then again every ``MODEL_RETRY_S``), never the reconciling pass:
the pass asks ``model`` (an answer, or None while there is none) and moves on, and a
lookup that answers wakes it. An answer is read to at most ``MAX_MODELS_BYTES``; a
longer one, a non-200 status, a body that is not JSON or lists no model of this
router is no answer. Lookups of endpoints no longer wanted are cancelled (``keep``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import aiohttp

from router.fleet.discovery.pods import PodEndpoint
from router.fleet.probes import read_at_most
from router.tasks import cancel_and_wait

MODEL_RETRY_S = 5.0
MAX_MODELS_BYTES = 1 << 20


@dataclass
class _Lookup:
    endpoint: PodEndpoint
    task: asyncio.Task[None] | None = None
    model: str | None = None


class ModelLookups:
    """Concurrent model lookups (see the module docstring), by worker id. ``on_answer``
    is called from the event loop when a lookup finds a model."""

    def __init__(self, session: aiohttp.ClientSession, names: Callable[[], Collection[str]],
                 timeout_s: float, on_answer: Callable[[], None]) -> None:
        self._session = session
        self._names = names
        self._timeout_s = timeout_s
        self._on_answer = on_answer
        self._lookups: dict[str, _Lookup] = {}

    def model(self, endpoint: PodEndpoint, headers: Mapping[str, str]) -> str | None:
        """The model ``endpoint`` serves if its lookup has answered; else None, and a
        lookup (sending ``headers``) is running for it. Never waits."""
        lookup = self._lookups.get(endpoint.worker_id)
        if lookup is not None and lookup.endpoint == endpoint:
            return lookup.model
        self.forget(endpoint.worker_id)
        lookup = self._lookups[endpoint.worker_id] = _Lookup(endpoint)
        lookup.task = asyncio.create_task(self._look_up(lookup, dict(headers)))
        return None

    def keep(self, wanted: Mapping[str, PodEndpoint]) -> None:
        """Cancel every lookup whose endpoint is not ``wanted`` as it is now."""
        for worker_id, lookup in list(self._lookups.items()):
            if wanted.get(worker_id) != lookup.endpoint:
                self.forget(worker_id)

    def forget(self, worker_id: str) -> None:
        """Drop ``worker_id``'s lookup and its answer (cancelled if still running)."""
        lookup = self._lookups.pop(worker_id, None)
        if lookup is not None and lookup.task is not None:
            lookup.task.cancel()

    async def close(self) -> None:
        """Cancel every lookup and wait for them to end."""
        lookups, self._lookups = list(self._lookups.values()), {}
        for lookup in lookups:
            if lookup.task is not None:
                await cancel_and_wait(lookup.task)

    async def _look_up(self, lookup: _Lookup, headers: dict[str, str]) -> None:
        """Ask until an answer names a model of this router; ends then (or cancelled)."""
        while lookup.model is None:
            lookup.model = await served_model(self._session, lookup.endpoint.url, headers,
                                              self._timeout_s, self._names())
            if lookup.model is None:
                await asyncio.sleep(MODEL_RETRY_S)
        self._on_answer()


async def served_model(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str],
                       timeout_s: float, names: Collection[str]) -> str | None:
    """The first model of ``names`` that ``url``'s ``/v1/models`` lists; None for no
    answer within ``timeout_s``, one over ``MAX_MODELS_BYTES``, or one naming none."""
    try:
        async with session.get(f"{url}/v1/models", headers=headers,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return None
            raw = await read_at_most(resp, MAX_MODELS_BYTES)
        body = json.loads(raw) if raw is not None else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    entries = body.get("data") if isinstance(body, dict) else None
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict) and entry.get("id") in names:
            return entry["id"]
    return None
