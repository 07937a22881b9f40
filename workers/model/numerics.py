"""The engine's numerics: which kernels write a worker's K and V, and the version of
their arithmetic. Both are part of the cache namespace, so two workers whose KV bytes
for the same tokens may differ never share an index entry, a transfer or a disk tier.

``ENGINE_NUMERICS_VERSION`` is bumped by the change that alters the bytes of K or V
computed for given tokens and weights: a kernel in ``workers/attention/``,
``workers/fused/`` or ``workers/lora/``, the model's own arithmetic
(``workers/model/llama.py``, ``rope.py``, ``merged.py``: an op's order, a dtype cast,
an accumulation), or the FP8 store. A change that leaves those bytes alone (the
scheduler, sampling, CUDA graphs: docs/decisions.md, "Engine numerics are part of the
namespace") does not bump it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.attention.backend import backend_name

ENGINE_NUMERICS_VERSION = 1


@dataclass(frozen=True)
class EngineNumerics:
    """The kernels that compute and store K and V (``attention_backend``: ``triton``
    or ``torch-reference``) and the version of their arithmetic."""

    attention_backend: str
    version: int

    @classmethod
    def on(cls, device: torch.device, version: int | None = None) -> EngineNumerics:
        """The numerics a worker on ``device`` runs: this build's
        ``ENGINE_NUMERICS_VERSION`` unless ``version`` (``model.numerics_version``)
        overrides it."""
        return cls(backend_name(device), ENGINE_NUMERICS_VERSION if version is None else version)
