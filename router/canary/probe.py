"""The quality probe: fixed prompts, run greedily on one worker of each pool and
compared token by token.

Each prompt goes to a ``radix`` worker's ``POST /generate`` (temperature 0,
``ignore_eos``, a fixed ``max_tokens``, scope ``direct``: no tenant's cache sees
it), one prompt after another so that each runs in the same way on both pools. A
candidate whose tokens differ from the baseline's on a prompt diverged there:
greedy decoding of one model is deterministic, so a difference comes from the KV
format (or the weights) and not from chance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import aiohttp

from radix.tree import DIRECT

Outputs = tuple[tuple[int, ...], ...]


class ProbeError(RuntimeError):
    """A worker did not answer a probe prompt with tokens."""


async def greedy_outputs(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str],
                         prompts: Sequence[Sequence[int]], max_tokens: int,
                         timeout_s: float) -> Outputs:
    """The greedy completion (``max_tokens`` token ids) of each prompt on the radix
    worker at ``url``; ProbeError when one is not answered within ``timeout_s``."""
    outputs = []
    for token_ids in prompts:
        body = {"token_ids": list(token_ids), "scope": DIRECT, "stream": False,
                "sampling": {"n": 1, "temperature": 0.0, "ignore_eos": True,
                             "max_tokens": max_tokens}}
        try:
            async with session.post(f"{url}/generate", json=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if resp.status != 200:
                    raise ProbeError(f"HTTP {resp.status}")
                answer = await resp.json()
            outputs.append(tuple(int(t) for t in answer["choices"][0]["token_ids"]))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError,
                TypeError) as exc:
            raise ProbeError(f"{type(exc).__name__}: {exc}") from exc
    return tuple(outputs)


def divergences(baseline: Outputs, candidate: Outputs) -> list[str]:
    """One line per prompt whose candidate tokens differ from the baseline's, naming
    the prompt and the first position that differs."""
    found = []
    for i, (expected, got) in enumerate(zip(baseline, candidate, strict=True)):
        if expected != got:
            at = next((j for j, (a, b) in enumerate(zip(expected, got, strict=False))
                       if a != b), min(len(expected), len(got)))
            found.append(f"prompt {i} differs at token {at}")
    return found
