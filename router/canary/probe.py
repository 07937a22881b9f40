"""The quality probe: fixed prompts, run greedily on one worker of each pool and
compared token by token.

Each prompt goes, one after another so that each runs in the same way on both
pools, to a ``radix`` worker's ``POST /generate`` (temperature 0, ``ignore_eos``, a
fixed ``max_tokens``, scope ``direct``: no tenant's cache sees it), or to a
``vllm`` or ``openai`` worker's ``POST /v1/completions`` with the same sampling, the
prompt as token ids and vLLM's ``return_token_ids``. A candidate whose tokens differ
from the baseline's on a prompt diverged there: greedy decoding of one model is
deterministic, so a difference comes from the KV format (or the weights) and not
from chance. Where either side returned text only (an OpenAI server without
``return_token_ids``), the texts are compared instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import aiohttp

from radix.generate import PATH as GENERATE_PATH
from radix.generate import GenerateRequest
from radix.keys import to_key
from radix.openai.sampling import Sampling
from radix.tree import DIRECT
from router.fleet.probes import MAX_PROBE_BYTES, ProbeError, read_at_most


class Answer(NamedTuple):
    """One probe prompt's greedy completion: its token ids (None when the server
    returned text only) and its text."""

    token_ids: tuple[int, ...] | None
    text: str


Outputs = tuple[Answer, ...]


async def greedy_outputs(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str],
                         prompts: Sequence[Sequence[int]], max_tokens: int, timeout_s: float,
                         openai_model: str | None = None) -> Outputs:
    """The greedy completion (``max_tokens`` tokens) of each prompt on the worker at
    ``url``: a radix worker's ``/generate``, or with ``openai_model`` its
    ``/v1/completions`` for that model; ProbeError when one is not answered within
    ``timeout_s``."""
    outputs = []
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for token_ids in prompts:
        if openai_model is None:
            path = GENERATE_PATH
            body = GenerateRequest(to_key(token_ids), DIRECT, sampling).to_wire()
        else:
            path = "/v1/completions"
            body = {"model": openai_model, "prompt": list(token_ids), "return_token_ids": True,
                    **sampling.to_wire(max_tokens)}
        try:
            async with session.post(f"{url}{path}", json=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if resp.status != 200:
                    raise ProbeError(f"HTTP {resp.status}")
                raw = await read_at_most(resp, MAX_PROBE_BYTES)
                if raw is None:
                    raise ProbeError(f"an answer over {MAX_PROBE_BYTES} bytes")
                choice = json.loads(raw)["choices"][0]
            ids = choice.get("token_ids")
            outputs.append(Answer(None if ids is None else tuple(int(t) for t in ids),
                                  str(choice.get("text") or "")))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError,
                TypeError, AttributeError) as exc:
            raise ProbeError(f"{type(exc).__name__}: {exc}") from exc
    return tuple(outputs)


def divergences(baseline: Outputs, candidate: Outputs) -> list[str]:
    """One line per prompt whose candidate differs from the baseline, naming the prompt
    and the first token (or, where either side has text only, character) that differs."""
    found = []
    for i, (expected, got) in enumerate(zip(baseline, candidate, strict=True)):
        if expected.token_ids is not None and got.token_ids is not None:
            a, b, unit = expected.token_ids, got.token_ids, "token"
        else:
            a, b, unit = expected.text, got.text, "character"  # type: ignore[assignment]
        if a != b:
            at = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                      min(len(a), len(b)))
            found.append(f"prompt {i} differs at {unit} {at}")
    return found
