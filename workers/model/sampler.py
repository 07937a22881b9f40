"""Next-token sampling: greedy, temperature, top-k, top-p, reproducible per request.

A sampled row draws one exponential noise vector from its own ``torch.Generator``
and takes ``argmax(probs / noise)`` (the exponential race, equivalent to drawing
from ``probs``). A row's token therefore depends only on its logits, its
parameters and its generator's state, never on which other rows share the batch.
A seeded row's generator is ``position_generator(seed, position)``: its state is a
function of the seed and the token's absolute position only, never of how many
draws came before, so a request resumed elsewhere with its generated tokens
appended to the prompt (or recomputed after a preemption) draws the same tokens.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks tokens and when it stops.

    ``temperature`` 0 is greedy; ``top_k`` None and ``top_p`` 1.0 disable those
    filters; ``seed`` None means fresh entropy. Generation stops after ``max_tokens``,
    at any of ``stop_token_ids``, and at EOS unless ``ignore_eos``.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)) or (
            self.temperature < 0
        ):
            raise ValueError(f"temperature: must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise ValueError(f"top_k: must be None or an int >= 1, got {self.top_k!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed: must be None or an int in [0, 2**63), got {self.seed!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be an int >= 1, got {self.max_tokens!r}")
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids: must be ints >= 0, got {self.stop_token_ids!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos: must be a bool, got {self.ignore_eos!r}")

    @property
    def is_greedy(self) -> bool:
        """True when the most likely token is always taken."""
        return self.temperature == 0


def position_generator(seed: int, position: int, device: torch.device | str) -> torch.Generator:
    """A generator on ``device`` seeded from (``seed``, ``position``) alone (keyed
    BLAKE2b of both, so nearby seeds and positions give unrelated streams); draw the
    token at absolute ``position`` (prompt tokens included) from it."""
    digest = hashlib.blake2b(position.to_bytes(8, "little"), digest_size=8,
                             key=seed.to_bytes(8, "little")).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest, "little") >> 1)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> list[int]:
    """One token id per row of ``logits`` [B, vocab], row ``i`` following ``params[i]``
    and drawing from ``generators[i]`` (None: torch's default generator)."""
    if not logits.shape[0] == len(params) == len(generators):
        raise ValueError(
            f"{logits.shape[0]} logit rows, {len(params)} params, {len(generators)} generators"
        )
    logits = logits.float()
    greedy_tokens = logits.argmax(dim=-1)
    if all(p.is_greedy for p in params):
        return greedy_tokens.tolist()
    probs = _filtered_probs(logits, params)
    noise = torch.stack(
        [torch.empty_like(probs[0]).exponential_(generator=generator) for generator in generators]
    )
    sampled = (probs / noise).argmax(dim=-1)
    is_greedy = torch.tensor([p.is_greedy for p in params], device=logits.device)
    return torch.where(is_greedy, greedy_tokens, sampled).tolist()


def _filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Unnormalized probabilities after temperature, top-k and top-p (greedy rows use
    temperature 1; their result is discarded)."""
    device, vocab = logits.device, logits.shape[1]
    temperatures = torch.tensor([p.temperature or 1.0 for p in params], device=device)
    scaled = logits / temperatures[:, None]
    if all(p.top_k is None and p.top_p == 1.0 for p in params):
        return torch.softmax(scaled, dim=-1)
    sorted_logits, sorted_ids = scaled.sort(dim=-1, descending=True)
    top_k = torch.tensor([p.top_k or vocab for p in params], device=device)
    ranks = torch.arange(vocab, device=device)
    sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    # Keep the smallest prefix whose mass reaches top_p: drop a token once the mass
    # before it already does. The first token is always kept.
    before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(before >= top_p[:, None], 0.0)
    return torch.zeros_like(sorted_probs).scatter_(-1, sorted_ids, sorted_probs)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
