"""Several projections of one input computed as one GEMM (vLLM's ``QKVParallelLinear``
and ``MergedColumnParallelLinear``, without the tensor parallelism).

q, k and v read the same normed hidden states, as gate and up read the same input of
the MLP. Concatenating their weights by output rows turns three (two) GEMMs into
one: fewer kernel launches per layer and a wider GEMM at small batch. The merge keeps
the checkpoint's parameters: each projection's weight (and bias) becomes a view of its
rows of the merged tensor, so the state dict, LoRA (which adds a delta per projection)
and the memory footprint are unchanged once the separate tensors are freed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


class MergedProjection(NamedTuple):
    """Projections ``names`` of one module as one weight (and bias), split back at
    ``sizes`` (each projection's output features, in order)."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    weight: torch.Tensor
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each projection of ``x``, as views of one GEMM's output."""
        return F.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)


def merge_linears(owner: nn.Module, names: Sequence[str]) -> MergedProjection:
    """Concatenate ``owner``'s ``nn.Linear`` projections ``names`` (all with a bias, or
    none) and re-point each one's parameters to its rows of the result. Call it once
    the weights are on their device and final."""
    linears = [getattr(owner, name) for name in names]
    has_bias = {linear.bias is not None for linear in linears}
    if len(has_bias) != 1:
        raise ValueError(f"cannot merge {list(names)}: some have a bias, some not")
    weight = torch.cat([linear.weight.detach() for linear in linears])
    bias = torch.cat([linear.bias.detach() for linear in linears]) if has_bias == {True} else None
    start = 0
    for linear in linears:
        end = start + linear.out_features
        linear.weight = nn.Parameter(weight[start:end], requires_grad=False)
        if bias is not None:
            linear.bias = nn.Parameter(bias[start:end], requires_grad=False)
        start = end
    return MergedProjection(tuple(names), tuple(linear.out_features for linear in linears),
                            weight, bias)
