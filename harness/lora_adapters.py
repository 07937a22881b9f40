"""PEFT LoRA adapter directories for tests and benchmarks (one place for both).

``write_config_adapters`` writes config-only adapters, which a timed worker accepts
(it reads no weights); ``write_peft_adapter`` writes a real adapter with random
``lora_A`` and ``lora_B`` (PEFT starts B at zero; random B makes every adapter change
the outputs), in PEFT's file names and tensor names, for a real model whose
``config.json`` it reads.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from workers.lora.peft_files import (
    CONFIG_FILE,
    TARGET_MODULES,
    WEIGHTS_FILE,
    BaseShapes,
    weight_key,
)


def adapter_config(rank: int, alpha: float, target_modules: Sequence[str] = TARGET_MODULES,
                   use_rslora: bool = False, base_model: str = "") -> dict[str, object]:
    """An ``adapter_config.json`` as PEFT writes it for a LoRA adapter."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
            "target_modules": list(target_modules), "use_rslora": use_rslora,
            "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
            "base_model_name_or_path": base_model, "inference_mode": True}


def write_config_adapters(root: Path, count: int, rank: int = 16,
                          target_modules: Sequence[str] = TARGET_MODULES,
                          prefix: str = "lora") -> list[tuple[str, Path]]:
    """``count`` config-only adapters ``<prefix>-<i>`` under ``root`` (for timed
    workers); each config differs (its name is its base model field), so each has
    its own digest. Returns ``(name, path)`` pairs."""
    adapters = []
    for i in range(count):
        name = f"{prefix}-{i}"
        path = root / name
        path.mkdir(parents=True, exist_ok=True)
        config = adapter_config(rank, 2 * rank, target_modules, base_model=name)
        (path / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        adapters.append((name, path))
    return adapters


def lora_module_flags(adapters: Sequence[tuple[str, Path]]) -> list[str]:
    """Worker flags that register ``adapters`` (``(name, path)`` pairs) at start."""
    return ["--enable-lora", "--lora-modules", *(f"{name}={path}" for name, path in adapters)]


def model_shapes(model_dir: Path) -> BaseShapes:
    """The projection shapes of the Llama checkpoint in ``model_dir`` (its config.json)."""
    config = json.loads((model_dir / "config.json").read_text())
    num_heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // num_heads
    return BaseShapes.llama(config["num_hidden_layers"], config["hidden_size"],
                            config["intermediate_size"], num_heads,
                            config.get("num_key_value_heads", num_heads), head_dim, 4)


def write_peft_adapter(path: Path, model_dir: Path, rank: int, alpha: float, seed: int,
                       target_modules: Sequence[str] = TARGET_MODULES, use_rslora: bool = False,
                       std: float = 0.1) -> Path:
    """A real random adapter for the checkpoint in ``model_dir``, written to ``path``."""
    shapes = model_shapes(model_dir)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(shapes.num_layers):
        for module in target_modules:
            in_features, out_features = shapes.projections[module]
            tensors[weight_key(layer, module, "lora_A")] = std * torch.randn(
                rank, in_features, generator=generator)
            tensors[weight_key(layer, module, "lora_B")] = std * torch.randn(
                out_features, rank, generator=generator)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / WEIGHTS_FILE))
    config = adapter_config(rank, alpha, target_modules, use_rslora, str(model_dir))
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    return path
