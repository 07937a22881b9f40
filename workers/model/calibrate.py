"""Record per-layer K/V maxima for FP8 KV scales.

``python -m workers.model.calibrate --model M --prompts FILE --out SCALES.json`` runs
each prompt (one per line of ``FILE``, blank lines skipped) through the model with
a KV cache in the model's own dtype, then reads the written K and V of every layer
and records their largest absolute values (``workers.kv.scales`` turns them into
scales for either FP8 format). The record names the model's weights digest and the
sha256 of the prompt file, and carries a sha256 of itself; a worker refuses a
record made for other weights or edited since.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path

import torch

from radix.model_source import DEMO_MODEL, resolve_model_path
from workers.kv.scales import calibration_record
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import LoadedModel, load_model
from workers.model.runner import ModelRunner
from workers.model.step_input import StepInput

BLOCK_SIZE = 16


def calibrate(loaded: LoadedModel, prompts: list[list[int]]) -> tuple[list[float], list[float]]:
    """Per-layer max |K| and max |V| over every token of ``prompts`` (each prefilled
    alone into a fresh cache in the model's dtype)."""
    config = loaded.model.config
    num_layers = config.num_hidden_layers
    k_amax, v_amax = [0.0] * num_layers, [0.0] * num_layers
    dtype, device = loaded.model.lm_head.weight.dtype, loaded.model.lm_head.weight.device
    for token_ids in prompts:
        num_blocks = math.ceil(len(token_ids) / BLOCK_SIZE)
        shape = (num_blocks, BLOCK_SIZE, config.num_key_value_heads, config.head_dim)
        keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        runner = ModelRunner(loaded.model, keys, values, BLOCK_SIZE)
        runner.execute([StepInput(token_ids, 0, list(range(num_blocks)))])
        for layer in range(num_layers):  # unwritten slots are zero: they cannot raise a max
            k_amax[layer] = max(k_amax[layer], keys[layer].abs().max().item())
            v_amax[layer] = max(v_amax[layer], values[layer].abs().max().item())
    return k_amax, v_amax


def main(argv: list[str] | None = None) -> dict[str, object]:
    """CLI entry point; writes the record and returns it."""
    parser = argparse.ArgumentParser(description="Calibrate per-layer FP8 KV scales.")
    parser.add_argument("--model", required=True, help="demo, a packaged model, GGUF or HF dir")
    parser.add_argument("--prompts", required=True, help="text file, one prompt per line")
    parser.add_argument("--out", required=True, help="where to write the JSON record")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-prompt-tokens", type=int, default=2048)
    args = parser.parse_args(argv)
    path = ensure_demo_checkpoint() if args.model == DEMO_MODEL else resolve_model_path(args.model)
    loaded = load_model(path, torch.device(args.device))
    raw = Path(args.prompts).read_bytes()
    lines = [line for line in raw.decode("utf-8").splitlines() if line.strip()]
    if not lines:
        parser.error(f"{args.prompts} holds no prompt")
    prompts = [loaded.tokenizer.encode(line)[: args.max_prompt_tokens] for line in lines]
    k_amax, v_amax = calibrate(loaded, prompts)
    record = calibration_record(
        loaded.weights_digest, hashlib.sha256(raw).hexdigest(), k_amax, v_amax
    )
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(k_amax)} layers, max |K| {max(k_amax):.3g}, "
          f"max |V| {max(v_amax):.3g}, sha256 {record['sha256']}")
    return record


if __name__ == "__main__":
    main()
