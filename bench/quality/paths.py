"""The gate's runs of a candidate beyond its own KV path: through the host and disk
tiers (``tiers``), and with decode steps replayed from CUDA graphs (``graphed``).

``tiers`` runs the candidate's config with a device pool that holds one sequence, a
host tier of a quarter of that and a disk tier of twice that (in a scratch
directory), and a session whose every admission starts from an empty device cache
(``Session(cold_device=True)``): each sequence's blocks are evicted into the host
tier when the next one starts, the host tier's oldest go on to disk, and every
prefix hit, the forced rerun of each prompt included, comes back from one or the
other. ``graphed`` runs the candidate's config with its decode steps captured in
CUDA graphs, as its worker runs them on a GPU. A path that cannot run says why: a
candidate without the prefix cache has no tiers; graphs need CUDA, a config
without ``model.enforce_eager`` and a RoPE that is not dynamic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.quality.compare import BucketSummary, PromptResult
from bench.quality.session import Session
from workers.build import kv_spec
from workers.config import WorkerConfig
from workers.kv.plan import DEFAULT_SAFETY_MARGIN
from workers.model.decode_graphs import CudaGraphCapture
from workers.model.loader import LoadedModel

PATHS = ("tiers", "graphed")
_COPY_BLOCKS = 2  # a hit ending inside a block copies it, and the answer may start one


@dataclass(frozen=True)
class PathSetup:
    """How a path runs: its session's ``config``, decode ``graphs`` and cold device,
    or, when it cannot run on this config and device, ``config`` None and the
    ``reason``."""

    name: str
    reason: str
    config: WorkerConfig | None = None
    graphs: CudaGraphCapture | None = None
    cold_device: bool = False

    def session(self, loaded: LoadedModel, secret: bytes) -> Session:
        """The path's session (only for a path that runs)."""
        assert self.config is not None, self.reason
        return Session(self.config, loaded, secret, graphs=self.graphs,
                       cold_device=self.cold_device)


@dataclass(frozen=True)
class PathRun:
    """A candidate's run down one path: what it was or why it did not run
    (``reason``), and when it ran its per-bucket summaries, each prompt's result, each
    bucket's failed checks and the worker's tier counters (``Session.tier_counters``)."""

    name: str
    reason: str
    ran: bool
    candidate: list[BucketSummary] = field(default_factory=list)
    results: list[PromptResult] = field(default_factory=list)
    failures: dict[str, list[str]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def exercised(self) -> bool:
        """Whether the path was taken: it ran, and when it ran over tiers some block came
        back from the host or the disk tier (prompts shorter than a block leave none)."""
        if not self.counters:
            return self.ran
        restored = ("kv_host_hit_blocks_total", "kv_disk_hit_blocks_total")
        return self.ran and any(self.counters.get(name, 0) for name in restored)

    @property
    def passed(self) -> bool:
        """Whether every bucket of the run passed (a path that did not run passes)."""
        return not any(self.failures.values())


def plan_path(
    name: str, candidate: WorkerConfig, loaded: LoadedModel, longest: int, scratch: Path
) -> PathSetup:
    """The setup of path ``name`` (one of ``PATHS``) for ``candidate``, whose longest
    sequence (prompt and answer) is ``longest`` tokens; a disk tier lives under
    ``scratch``."""
    if name == "tiers":
        return _tiers(candidate, loaded, longest, scratch)
    if name == "graphed":
        return _graphed(candidate, loaded)
    raise ValueError(f"unknown path {name!r}, expected one of {PATHS}")


def _tiers(candidate: WorkerConfig, loaded: LoadedModel, longest: int, scratch: Path) -> PathSetup:
    if not candidate.kv.prefix_cache:
        return PathSetup("tiers", "skipped: the candidate runs without the prefix cache, "
                                  "and the host and disk tiers hang below it")
    spec = kv_spec(loaded.config, candidate.kv.block_size, candidate.kv.cache_dtype)
    num_device = math.ceil(longest / spec.block_size) + _COPY_BLOCKS
    num_host = max(1, num_device // 4)
    block_bytes = spec.kv_bytes_per_block
    config = candidate.with_overrides({"kv": {
        # the plan keeps its margin off the budget: ask for one block more than it needs
        "cache_bytes": math.ceil((num_device + 1) * block_bytes / (1 - DEFAULT_SAFETY_MARGIN)),
        "host_cache_bytes": num_host * block_bytes,
        "disk_cache_dir": str(scratch),
        "disk_cache_bytes": 2 * num_device * block_bytes,
    }})
    return PathSetup("tiers", "a device pool of one sequence, emptied into the host tier "
                              "before every sequence; host tier a quarter of the pool, disk "
                              "tier twice it", config, cold_device=True)


def _graphed(candidate: WorkerConfig, loaded: LoadedModel) -> PathSetup:
    device = loaded.model.lm_head.weight.device
    if device.type != "cuda":
        return PathSetup("graphed", f"skipped: CUDA graphs are GPU-only and the gate ran on "
                                    f"{device.type}")
    if candidate.model.enforce_eager:
        return PathSetup("graphed", "skipped: the candidate sets model.enforce_eager, so its "
                                    "worker decodes eagerly")
    if loaded.model.rotary.is_dynamic:
        return PathSetup("graphed", "skipped: the model's dynamic-NTK RoPE keeps every decode "
                                    "step eager")
    name = torch.cuda.get_device_name(device)
    return PathSetup("graphed", f"decode steps replayed from a CUDA graph on {name}",
                     candidate, graphs=CudaGraphCapture())
