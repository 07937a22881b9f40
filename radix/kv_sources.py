"""What a worker's KV costs to recompute, restore and move: the numbers a router weighs
when it chooses where a request's missing blocks come from (docs/router-index.md,
"Where the missing blocks come from").

A worker reports them in ``/info`` (``kv_transfer.costs``, ``SourceCosts.to_dict``):
its KV bytes per token and its prefill chunk (``max_batched_tokens``) always; a timed
worker also its profile's step costs (``radix.cost_model.CostModel``), link and
host-to-device rates and its time scale. What a worker leaves out (a real worker does
not know its link, and its prefill rate depends on the hardware) the router fills
from its own settings (``SourceCosts.parse``'s ``defaults``), which
``python -m bench crossover`` measures.

Every time here is in the router's seconds: a timed worker's profile seconds times
its ``time_scale``, so a pull's fixed overhead (real HTTP and TCP) and the profile's
waits add up. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from radix.cost_model import CostModel

# What a router assumes for the rates a worker leaves out of its costs.
DEFAULT_FIELDS = ("prefill_s_per_token", "link_bytes_per_s", "restore_bytes_per_s")
_COST_FIELDS = ("a", "b", "c", "d", "e", "f")


@dataclass(frozen=True)
class SourceCosts:
    """One worker's costs (module docstring). ``prefill`` (a timed profile's step
    costs) decides what a recompute costs when given, else ``prefill_s_per_token``."""

    kv_bytes_per_token: int
    max_batched_tokens: int
    prefill_s_per_token: float
    link_bytes_per_s: float
    restore_bytes_per_s: float
    prefill: CostModel | None = None
    time_scale: float = 1.0

    def recompute_s(self, start: int, end: int) -> float:
        """Seconds to prefill the prompt's tokens ``[start, end)`` after ``start``
        cached ones, in chunks of ``max_batched_tokens`` (each attending over the
        prompt up to its end), on an otherwise idle worker."""
        if end <= start:
            return 0.0
        if self.prefill is None:
            return (end - start) * self.prefill_s_per_token
        total_s, chunk = 0.0, max(self.max_batched_tokens, 1)
        for first in range(start, end, chunk):
            last = min(first + chunk, end)
            total_s += self.prefill.prefill_chunk_s(last - first, last)
        return total_s * self.time_scale

    def transfer_s(self, num_tokens: int) -> float:
        """Seconds ``num_tokens`` tokens of KV take on the link, alone on it."""
        return num_tokens * self.kv_bytes_per_token / self.link_bytes_per_s * self.time_scale

    def restore_s(self, num_tokens: int) -> float:
        """Seconds to copy ``num_tokens`` tokens of KV from host memory to the device."""
        return num_tokens * self.kv_bytes_per_token / self.restore_bytes_per_s * self.time_scale

    def step_s(self, num_running: int, num_waiting_tokens: int, num_context_tokens: int
               ) -> float:
        """Seconds of one engine step of a worker with ``num_running`` sequences of about
        ``num_context_tokens`` each and ``num_waiting_tokens`` prompt tokens queued (a
        prefill chunk of them, at most ``max_batched_tokens``, and a decode step of the
        rest): how long a command for its engine thread (a hold's pin) waits behind
        the step running there. 0 for an idle worker."""
        chunk = min(num_waiting_tokens, self.max_batched_tokens)
        if self.prefill is None:
            return (chunk + num_running) * self.prefill_s_per_token
        total_s = self.prefill.prefill_chunk_s(chunk, num_context_tokens) if chunk else 0.0
        total_s += self.prefill.decode_step_s(num_running, num_running * num_context_tokens)
        return total_s * self.time_scale

    def to_dict(self, *, with_rates: bool) -> dict[str, Any]:
        """The ``/info`` form: the rates and the profile only ``with_rates`` (a worker
        that knows them: a timed one)."""
        body: dict[str, Any] = {"kv_bytes_per_token": self.kv_bytes_per_token,
                                "max_batched_tokens": self.max_batched_tokens,
                                "time_scale": self.time_scale}
        if with_rates:
            body.update({name: getattr(self, name) for name in DEFAULT_FIELDS})
        if self.prefill is not None:
            body["prefill"] = {name: getattr(self.prefill, name) for name in _COST_FIELDS}
        return body

    @classmethod
    def parse(cls, data: Mapping[str, Any], defaults: Mapping[str, float]) -> SourceCosts:
        """The costs a worker reported, each rate it left out taken from ``defaults``
        (``DEFAULT_FIELDS``); ValueError naming the first bad field."""
        def positive(name: str, value: Any, kind: type = float) -> Any:
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value) or value <= 0
                    or (kind is int and not isinstance(value, int))):
                raise ValueError(f"kv_transfer.costs.{name}: a positive {kind.__name__} "
                                 f"is required, got {value!r}")
            return kind(value)

        rates = {name: positive(name, data.get(name, defaults.get(name)))
                 for name in DEFAULT_FIELDS}
        prefill = data.get("prefill")
        if prefill is not None:
            if not isinstance(prefill, Mapping):
                raise ValueError("kv_transfer.costs.prefill: an object is required")
            prefill = CostModel(**{name: _non_negative(prefill.get(name), name)
                                   for name in _COST_FIELDS})
        return cls(positive("kv_bytes_per_token", data.get("kv_bytes_per_token"), int),
                   positive("max_batched_tokens", data.get("max_batched_tokens"), int),
                   prefill=prefill,
                   time_scale=positive("time_scale", data.get("time_scale", 1.0)), **rates)


def _non_negative(value: Any, name: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value < 0):
        raise ValueError(f"kv_transfer.costs.prefill.{name}: a number >= 0 is required, "
                         f"got {value!r}")
    return float(value)
