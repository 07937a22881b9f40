"""One worker configuration's KV path, driven one sequence at a time.

A ``Session`` builds what a worker builds from its config (KV spec and dtype, scales,
plan, KV manager with the radix or null prefix cache, model runner) and runs each
prompt through it: admit (prefix match), chunked prefill of the uncached rest,
then decode step by step, either greedily or forced along a given path, keeping
the next-token log-probabilities of every step. Finished sequences are committed,
so later prompts hit the prefix cache exactly as in a worker. The engine's batching
is left out on purpose: scoring needs the distribution at every step and a forced
path, which the engine does not expose, and one sequence at a time makes runs
reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radix.tree import Scope
from workers.build import kv_scales, kv_spec
from workers.config import DEFAULT_CACHE_BYTES, WorkerConfig
from workers.kv.build import build_kv_cache_manager
from workers.kv.ids import SeqId
from workers.kv.plan import plan_kv_cache
from workers.model.loader import LoadedModel
from workers.model.runner import ModelRunner
from workers.model.step_input import StepInput

SCOPE = Scope("quality")


@dataclass(frozen=True)
class Generation:
    """The tokens a run produced (or was forced along) and the log-probabilities
    [len(token_ids), vocab] of the distribution each was chosen from."""

    token_ids: tuple[int, ...]
    logprobs: torch.Tensor


class Session:
    """The KV path of ``config`` over an already loaded model."""

    def __init__(self, config: WorkerConfig, loaded: LoadedModel) -> None:
        spec = kv_spec(loaded.config, config.kv.block_size, config.kv.cache_dtype)
        plan = plan_kv_cache(spec, config.kv.cache_bytes or DEFAULT_CACHE_BYTES)
        scales = kv_scales(spec, config.kv.scales_file, loaded.weights_digest)
        self.manager = build_kv_cache_manager(
            spec, plan.num_blocks, namespace_digest=b"quality", worker_id="quality",
            device=loaded.model.lm_head.weight.device, prefix_caching=config.kv.prefix_cache,
        )
        tensors = self.manager.tensors
        self.runner = ModelRunner(
            loaded.model, tensors.key_caches, tensors.value_caches, spec.block_size, scales
        )
        self.chunk_tokens = config.engine.max_batched_tokens
        self.stop_token_ids = frozenset(loaded.tokenizer.eos_token_ids)
        self.description = f"{spec.dtype} KV, {scales.describe()}, prefix cache " + (
            "on" if config.kv.prefix_cache else "off"
        )
        self._next_seq_id = 0

    def generate(
        self, prompt: Sequence[int], max_new_tokens: int, forced: Sequence[int] | None = None
    ) -> Generation:
        """Greedy decoding of up to ``max_new_tokens`` (stopping after an EOS token), or,
        with ``forced``, exactly those tokens fed back whatever the model prefers."""
        self._next_seq_id += 1
        seq_id = SeqId(self._next_seq_id)
        manager = self.manager
        if manager.admit(seq_id, prompt, SCOPE) is None:
            raise ValueError(f"a prompt of {len(prompt)} tokens does not fit the KV cache")
        tokens = list(prompt)
        steps: list[torch.Tensor] = []
        try:
            logits = self._prefill(seq_id, tokens)
            num_new = max_new_tokens if forced is None else len(forced)
            for step in range(num_new):
                steps.append(torch.log_softmax(logits.float(), -1))
                token = int(logits.argmax()) if forced is None else int(forced[step])
                tokens.append(token)
                if step + 1 == num_new or (forced is None and token in self.stop_token_ids):
                    break
                logits = self._run(seq_id, tokens[-1:])
            manager.commit(seq_id, tokens, manager.num_computed_tokens(seq_id))
        finally:
            manager.free(seq_id)
        return Generation(tuple(tokens[len(prompt) :]), torch.stack(steps))

    def _prefill(self, seq_id: SeqId, tokens: list[int]) -> torch.Tensor:
        done = self.manager.num_computed_tokens(seq_id)
        logits = None
        while done < len(tokens):
            chunk = tokens[done : done + self.chunk_tokens]
            logits = self._run(seq_id, chunk)
            done += len(chunk)
        assert logits is not None
        return logits

    def _run(self, seq_id: SeqId, new_tokens: list[int]) -> torch.Tensor:
        start = self.manager.num_computed_tokens(seq_id)
        if not self.manager.append_slots(seq_id, len(new_tokens)):
            raise ValueError("the KV cache ran out of blocks")
        step = StepInput(new_tokens, start, self.manager.block_table(seq_id))
        return self.runner.execute([step])[0]
