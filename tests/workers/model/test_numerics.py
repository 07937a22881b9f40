"""A worker's cache namespace carries its engine numerics: the kernels that write its
K and V (by device) and the numerics version, this build's unless
``model.numerics_version`` overrides it."""

from __future__ import annotations

import dataclasses

import torch

from radix.namespace import CacheNamespace
from workers.build import build_worker
from workers.config import ModelSettings, WorkerConfig
from workers.model.numerics import ENGINE_NUMERICS_VERSION, EngineNumerics

PROFILE = "timed:llama3-8b-h100"  # a timed model: no weights to load


def namespace(**model: object) -> CacheNamespace:
    config = WorkerConfig(model=ModelSettings(name=PROFILE, **model))  # type: ignore[arg-type]
    return build_worker(config, "w", b"secret").identity.namespace


def test_the_device_picks_the_backend_and_the_build_the_version():
    assert EngineNumerics.on(torch.device("cpu")) == EngineNumerics(
        "torch-reference", ENGINE_NUMERICS_VERSION)
    assert EngineNumerics.on(torch.device("cuda")).attention_backend == "triton"
    assert EngineNumerics.on(torch.device("cpu"), 7).version == 7


def test_a_worker_namespace_carries_its_numerics_and_the_override_splits_it():
    default, overridden = namespace(), namespace(numerics_version=ENGINE_NUMERICS_VERSION + 1)
    assert (default.attention_backend, default.engine_numerics_version) == (
        "torch-reference", ENGINE_NUMERICS_VERSION)
    assert overridden == dataclasses.replace(
        default, engine_numerics_version=ENGINE_NUMERICS_VERSION + 1)
    assert default.digest(b"s") != overridden.digest(b"s")
    assert namespace(numerics_version=ENGINE_NUMERICS_VERSION) == default
