"""The timed backend (``--model timed:<profile>``): a forward pass that only takes time.

``TimedRunner`` stands where ``ModelRunner`` stands in the engine. Everything around
it stays real (scheduler, KV manager, prefix cache, copy-on-write, preemption, KV
events, HTTP, metrics); its ``execute`` computes nothing: it waits the step's cost
under the profile's ``radix.cost_model.CostModel`` (a sleep on the engine thread,
which burns no CPU while the event loop keeps serving HTTP) and returns logits that
put all their weight on one token. That token is a keyed hash of the sequence's last
token and the new token's position over ``output_token_ids``, so outputs repeat run
after run, never depend on the batch a sequence shares, and a resumed or recomputed
sequence draws the same tokens again.

The KV tensors of a timed worker hold one element per token slot (``timed_tensor_spec``):
block copies stay real operations while a 70B-shaped cache of hundreds of thousands
of tokens costs a few megabytes. The KV plan, the namespace and the events use the
profile's real shape (``timed_kv_spec``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence

import torch

from radix.cost_model import CostModel, Profile, get_profile
from radix.kv_sources import SourceCosts
from workers.kv.spec import KVCacheSpec
from workers.lora.peft_files import AdapterSpec, BaseShapes
from workers.model.step_input import StepInput

TIMED_PREFIX = "timed:"
# The logit of the chosen token over zeros elsewhere: with a vocabulary of a few
# hundred, sampling at temperature 1 picks another token with probability ~1e-11.
_CHOSEN_LOGIT = 30.0


def timed_profile(model_name: str) -> Profile | None:
    """The profile of a ``timed:<profile>`` model name, None for any other name;
    ValueError for an unknown profile."""
    if not model_name.startswith(TIMED_PREFIX):
        return None
    return get_profile(model_name.removeprefix(TIMED_PREFIX))


def timed_kv_spec(profile: Profile, block_size: int) -> KVCacheSpec:
    """The KV layout of the profile's model: what its plan, namespace and events use."""
    return KVCacheSpec(profile.num_layers, profile.num_kv_heads, profile.head_dim,
                       profile.kv_dtype, block_size)


def timed_link_s_per_block(profile: Profile, block_size: int, time_scale: float) -> float:
    """Seconds one block of the profile's real shape takes over its prefill-to-decode
    link, ``time_scale`` times slower: what a timed consumer waits per pulled block
    (its own blocks are a few bytes)."""
    return timed_kv_spec(profile, block_size).kv_bytes_per_block / profile.link_bytes_per_s \
        * time_scale


def timed_source_costs(profile: Profile, block_size: int, max_batched_tokens: int,
                       time_scale: float) -> SourceCosts:
    """What a timed worker reports a router of its KV costs: its profile's step costs,
    KV bytes per token, link and host-to-device rates, at ``time_scale``."""
    return SourceCosts(timed_kv_spec(profile, block_size).kv_bytes_per_token,
                       max_batched_tokens, profile.cost.b, profile.link_bytes_per_s,
                       profile.h2d_bytes_per_s, profile.cost, time_scale)


def timed_tensor_spec(block_size: int) -> KVCacheSpec:
    """The layout a timed worker's KV tensors are allocated with: one float32 element
    per token slot, K and V."""
    return KVCacheSpec(1, 1, 1, "float32", block_size)


def timed_lora_shapes(profile: Profile) -> BaseShapes | None:
    """The projections of the profile's model an adapter must fit (None: the profile
    gives no shapes, so adapters are refused)."""
    if None in (profile.hidden_size, profile.intermediate_size, profile.num_attention_heads):
        return None
    bytes_per_element = 4 if profile.kv_dtype == "float32" else 2
    return BaseShapes.llama(profile.num_layers, profile.hidden_size, profile.intermediate_size,
                            profile.num_attention_heads, profile.num_kv_heads, profile.head_dim,
                            bytes_per_element)  # type: ignore[arg-type]


class TimedSlotLoader:
    """A timed worker's adapter slots: a load waits ``Profile.lora_load_s`` of the
    adapter's bytes (times ``time_scale``); no weights exist."""

    def __init__(self, profile: Profile, time_scale: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.profile = profile
        self.time_scale = time_scale
        self._sleep = sleep

    def load(self, slot: int, spec: AdapterSpec) -> None:
        """Wait as long as copying the adapter to the device would take."""
        self._sleep(self.time_scale * self.profile.lora_load_s(spec.num_bytes))

    def clear(self, slot: int) -> None:
        """Nothing to clear."""


def profile_digest(profile: Profile) -> str:
    """Stands for a weights digest: the profile's every field, so two profiles (or one
    whose constants changed) never share KV blocks."""
    return hashlib.sha256(f"radix-router/timed/v1 {profile!r}".encode()).hexdigest()


class TimedRunner:
    """``ModelRunner``'s interface over a cost model (module docstring).

    ``sleep`` is how a step's cost times ``time_scale`` is waited (``time.sleep``;
    tests pass a recorder).
    ``output_token_ids`` are the tokens outputs are drawn from (never EOS, so a run's
    length is its ``max_tokens``); ``vocab_size`` is the logits' width.
    """

    def __init__(self, cost: CostModel, vocab_size: int, output_token_ids: Sequence[int],
                 seed: int = 0, sleep: Callable[[float], None] = time.sleep,
                 time_scale: float = 1.0) -> None:
        if not output_token_ids or max(output_token_ids) >= vocab_size:
            raise ValueError("output_token_ids must be non-empty ids below vocab_size")
        self.cost = cost
        self.vocab_size = vocab_size
        self.output_token_ids = tuple(output_token_ids)
        self._key = seed.to_bytes(8, "little")
        self._sleep = sleep
        self.time_scale = time_scale

    def execute(self, batch: Sequence[StepInput]) -> torch.Tensor:
        """Wait the step's cost, then return float32 logits [len(batch), vocab] whose
        row ``i`` chooses ``next_token(batch[i])``. ValueError on an empty batch or an
        empty ``token_ids``."""
        if not batch or any(not step.token_ids for step in batch):
            raise ValueError("a step needs at least one entry, each with new tokens")
        self._sleep(self.time_scale * self.cost.step_s(
            (len(step.token_ids), step.num_computed_tokens + len(step.token_ids)) for step in batch))
        logits = torch.zeros(len(batch), self.vocab_size)
        for row, step in enumerate(batch):
            logits[row, self.next_token(step)] = _CHOSEN_LOGIT
        return logits

    def next_token(self, step: StepInput) -> int:
        """The token after ``step``'s last one: a function of that token and its position."""
        position = step.num_computed_tokens + len(step.token_ids)
        digest = hashlib.blake2b(
            step.token_ids[-1].to_bytes(4, "little") + position.to_bytes(8, "little"),
            key=self._key, digest_size=8).digest()
        return self.output_token_ids[int.from_bytes(digest, "little") % len(self.output_token_ids)]
