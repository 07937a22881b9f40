"""PEFT LoRA adapter directories: read, check against the base model, digest.

An adapter directory holds ``adapter_config.json`` and, for a real model,
``adapter_model.safetensors`` with PEFT's key names
(``base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`` ``[r, in]`` and
``...lora_B.weight`` ``[out, r]``). Everything is checked before any slot is touched:
the rank against ``max_lora_rank``, every target module against the projections the
model wraps, every tensor's presence and shape (from the safetensors header, without
reading the weights). A refusal is an ``AdapterError`` naming the field.

The digest is the sha256 of the config file's bytes then the weights file's bytes:
the adapter's part of its ``CacheNamespace``. Only regular files are read (a FIFO
would block the reader for good), and loading an adapter into a slot reads its files
again and refuses them unless they still have the digest it was registered with.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
TARGET_MODULES = ATTENTION_MODULES + MLP_MODULES
# PEFT fields that change the arithmetic and are not supported: their neutral values.
_NEUTRAL = {"use_dora": False, "bias": "none", "layers_to_transform": None,
            "rank_pattern": {}, "alpha_pattern": {}, "modules_to_save": None}


class AdapterError(ValueError):
    """An adapter that cannot be served here; ``param`` names the offending field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class BaseShapes:
    """What an adapter must fit: the model's layers and each projection's
    ``(in_features, out_features)``, and its weights' bytes per element."""

    num_layers: int
    projections: Mapping[str, tuple[int, int]]
    bytes_per_element: int

    @classmethod
    def llama(cls, num_layers: int, hidden: int, intermediate: int, num_heads: int,
              num_kv_heads: int, head_dim: int, bytes_per_element: int) -> BaseShapes:
        """The shapes of a Llama-family decoder."""
        q, kv = num_heads * head_dim, num_kv_heads * head_dim
        return cls(num_layers, {
            "q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
            "o_proj": (q, hidden), "gate_proj": (hidden, intermediate),
            "up_proj": (hidden, intermediate), "down_proj": (intermediate, hidden),
        }, bytes_per_element)


@dataclass(frozen=True)
class AdapterSpec:
    """A checked adapter: rank, scale (``lora_alpha / r``, or ``/ sqrt(r)`` with
    rsLoRA), target modules, where its weights are (None: a config-only adapter for a
    timed worker), its digest and its size in bytes at the model's dtype."""

    name: str
    path: str
    rank: int
    scale: float
    target_modules: tuple[str, ...]
    weights_file: str | None
    digest: str
    num_bytes: int


def weight_key(layer: int, module: str, part: str) -> str:
    """PEFT's tensor name of ``part`` (``lora_A`` or ``lora_B``) of one projection."""
    block = "self_attn" if module in ATTENTION_MODULES else "mlp"
    return f"base_model.model.model.layers.{layer}.{block}.{module}.{part}.weight"


def read_adapter(name: str, path: str | Path, shapes: BaseShapes, max_rank: int,
                 needs_weights: bool = True) -> AdapterSpec:
    """The checked adapter at ``path``; AdapterError naming the field otherwise.
    ``needs_weights`` False accepts a directory with only its config."""
    directory = Path(path)
    config_path = directory / CONFIG_FILE
    config_bytes = _read_regular(config_path)
    try:
        config = json.loads(config_bytes)
    except ValueError as exc:
        raise AdapterError(f"cannot read {config_path}: {exc}", "lora_path") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{config_path} is not a JSON object", "lora_path")
    rank, scale, targets = _check_config(config, shapes, max_rank)
    weights_path = directory / WEIGHTS_FILE
    digest = hashlib.sha256(config_bytes)
    has_weights = weights_path.exists()
    if has_weights:
        weights = _read_regular(weights_path)
        _check_tensors(weights_path, weights, shapes, rank, targets)
        digest.update(weights)
    elif needs_weights:
        raise AdapterError(f"{weights_path} is missing", "lora_path")
    num_elements = sum(rank * sum(shapes.projections[m]) for m in targets) * shapes.num_layers
    return AdapterSpec(name, str(directory), rank, scale, targets,
                       str(weights_path) if has_weights else None, digest.hexdigest(),
                       num_elements * shapes.bytes_per_element)


def _read_regular(path: Path) -> bytes:
    """The bytes of ``path`` if it is a regular file; AdapterError otherwise (a FIFO,
    a device or a directory is refused before anything reads from it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise AdapterError(f"cannot read {path}: {exc.strerror}", "lora_path") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise AdapterError(f"{path} is not a regular file", "lora_path")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)


def _check_config(config: dict, shapes: BaseShapes, max_rank: int
                  ) -> tuple[int, float, tuple[str, ...]]:
    """``(r, scale, target_modules)`` of a PEFT config, or AdapterError."""
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"peft_type {config.get('peft_type')!r} is not LORA", "peft_type")
    rank = config.get("r")
    if type(rank) is not int or rank < 1:
        raise AdapterError(f"r must be a positive integer, got {rank!r}", "r")
    if rank > max_rank:
        raise AdapterError(f"r is {rank}, above this worker's max_lora_rank {max_rank}", "r")
    alpha = config.get("lora_alpha", rank)
    if type(alpha) not in (int, float) or alpha <= 0:
        raise AdapterError(f"lora_alpha must be a positive number, got {alpha!r}", "lora_alpha")
    for field, neutral in _NEUTRAL.items():
        if config.get(field) not in (None, neutral):
            raise AdapterError(f"{field} {config[field]!r} is not supported", field)
    targets = config.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise AdapterError("target_modules must be a non-empty list of module names",
                           "target_modules")
    unknown = sorted(set(targets) - set(shapes.projections))
    if unknown:
        raise AdapterError(f"target_modules {unknown} are not among this model's projections "
                           f"{sorted(shapes.projections)}", "target_modules")
    scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    return rank, float(scale), tuple(m for m in TARGET_MODULES if m in targets)


def _check_tensors(weights_path: Path, weights: bytes, shapes: BaseShapes, rank: int,
                   targets: tuple[str, ...]) -> None:
    """Every ``lora_A``/``lora_B`` of every layer and target present with its shape,
    and no other tensor; read from the safetensors header only."""
    try:
        size = int.from_bytes(weights[:8], "little")
        header = json.loads(weights[8: 8 + size])
        found = {key: tuple(entry["shape"]) for key, entry in header.items()
                 if key != "__metadata__"}
    except Exception as exc:
        raise AdapterError(f"cannot read {weights_path}: {exc}", "lora_path") from None
    for layer in range(shapes.num_layers):
        for module in targets:
            in_features, out_features = shapes.projections[module]
            for part, expected in (("lora_A", (rank, in_features)), ("lora_B", (out_features, rank))):
                key = weight_key(layer, module, part)
                shape = found.pop(key, None)
                if shape is None:
                    raise AdapterError(f"tensor {key} is missing", key)
                if shape != expected:
                    raise AdapterError(f"tensor {key} has shape {list(shape)}, expected "
                                       f"{list(expected)}", key)
    if found:
        raise AdapterError(f"tensor {min(found)} does not belong to a target module of this "
                           "model", min(found))


def load_tensors(spec: AdapterSpec) -> dict[str, torch.Tensor]:
    """The adapter's tensors by PEFT name, on the CPU, read again now; AdapterError
    when its files no longer have the digest it was registered with."""
    if spec.weights_file is None:
        raise ValueError(f"adapter {spec.name!r} has no weights file")
    weights = _read_regular(Path(spec.weights_file))
    digest = hashlib.sha256(_read_regular(Path(spec.path) / CONFIG_FILE))
    digest.update(weights)
    if digest.hexdigest() != spec.digest:
        raise AdapterError(f"the adapter {spec.name!r} changed on disk since it was "
                           "registered; register it again", "lora_path")
    return safetensors.torch.load(weights)
