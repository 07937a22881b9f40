"""The demo checkpoint: a small random-weight Llama written as a real HF directory.

``--model demo`` loads it through the same loader as any checkpoint, so the whole
system runs with no download. Weights are drawn from a seeded CPU
``torch.Generator`` with ``randint`` (integer draws, scaled by powers of two and a
float32 constant), so the files are byte-identical on every run and machine.
Bump ``DEMO_VERSION`` whenever the bytes change: it names the cache directory.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from radix.tokenizer import PromptTokenizer, demo_tokenizer_files
from workers.model.config import ModelConfig
from workers.model.llama import LlamaForCausalLM

DEMO_VERSION = "1"
DEMO_SEED = 1234
_UNIFORM_BITS = 23


def demo_config() -> dict[str, Any]:
    """The demo config.json: hidden 256, 4 layers, 8 heads over 4 KV heads of 32 dims,
    SwiGLU 688, vocabulary = demo tokenizer size rounded up to a multiple of 64."""
    tokenizer = PromptTokenizer.demo()
    assert tokenizer.bos_token_id is not None
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": -(-tokenizer.vocab_size // 64) * 64,
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_ids[0],
    }


def write_demo_checkpoint(path: str | Path) -> Path:
    """Write the demo checkpoint into directory ``path`` (created if needed); return it."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    config = demo_config()
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    texts = {
        "config.json": _json_text(config),
        "generation_config.json": _json_text(generation),
        **demo_tokenizer_files(),
    }
    for name, text in texts.items():
        (root / name).write_bytes(text.encode())
    save_file(_demo_weights(ModelConfig.from_dict(config)), root / "model.safetensors",
              metadata={"format": "pt"})
    return root


def ensure_demo_checkpoint(cache_dir: str | Path | None = None) -> Path:
    """The demo checkpoint directory ``demo_dir_name()``, written once into ``cache_dir``
    (default ``$RADIX_ROUTER_CACHE`` or ``~/.cache/radix-router``).

    Written into a temporary sibling and renamed into place, so a reader never sees a
    partial directory and concurrent callers all end up with the same complete one.
    """
    root = Path(
        cache_dir or os.environ.get("RADIX_ROUTER_CACHE") or Path.home() / ".cache" / "radix-router"
    )
    target = root / demo_dir_name()
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".demo-{DEMO_VERSION}-", dir=root))
    try:
        write_demo_checkpoint(staging)
        staging.chmod(0o755)
        os.rename(staging, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def demo_dir_name() -> str:
    """``demo-<version>-<fingerprint>``: the fingerprint hashes the config and tokenizer
    texts, so editing them never reuses a stale cached copy; weight changes bump
    ``DEMO_VERSION`` (a golden-hash test enforces it)."""
    texts = [_json_text(demo_config()), *demo_tokenizer_files().values()]
    fingerprint = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:12]
    return f"demo-{DEMO_VERSION}-{fingerprint}"


def _demo_weights(config: ModelConfig) -> dict[str, torch.Tensor]:
    """Every tensor of the model, in name order: norms are ones, embeddings uniform in
    [-1, 1), linear weights uniform in [-1, 1) / sqrt(fan_in)."""
    with torch.device("meta"):
        shapes = {name: tuple(t.shape) for name, t in LlamaForCausalLM(config).state_dict().items()}
    generator = torch.Generator().manual_seed(DEMO_SEED)
    weights = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shape, dtype=torch.float32)
            continue
        draws = torch.randint(-(2**_UNIFORM_BITS), 2**_UNIFORM_BITS, shape, generator=generator)
        uniform = draws.to(torch.float32) / 2**_UNIFORM_BITS
        scale = 1.0 if name.endswith("embed_tokens.weight") else 1.0 / math.sqrt(shape[1])
        weights[name] = uniform * torch.tensor(scale, dtype=torch.float32)
    return weights


def _json_text(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
