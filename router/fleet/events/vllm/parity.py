"""Token parity: does a vLLM server turn text into the same token ids as the router?

The router sends vLLM its own token ids, and vLLM's KV events report token ids: an
index built from them is only right if the ids mean the same text on both sides (the
same vocabulary, the same chat template). At registration the router tokenizes a
probe text and a probe chat (through the template, with the generation prompt) and
compares with vLLM's ``POST /tokenize``. A server that disagrees, or cannot say, is
routed approximately, with the reason in ``GET /admin/workers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from radix.tokenizer import PromptTokenizer

PROBE_TEXT = ("Prefix caches key on token ids: naïve café, 東京, emoji 🚀, tabs\tand  "
              "double spaces, numbers 1234567 and 3.14159, <b>markup</b> and a\nnew line.")
PROBE_CHAT = (
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Name three prime numbers larger than 100, please."},
)


async def token_parity_problem(session: aiohttp.ClientSession, url: str,
                               headers: Mapping[str, str], served_model: str,
                               tokenizer: PromptTokenizer, timeout_s: float) -> str | None:
    """None when vLLM's ``/tokenize`` agrees with ``tokenizer`` on the probe text and
    the probe chat; else what differs (or why it could not be checked)."""
    probes: list[tuple[str, dict[str, Any], list[int]]] = [
        ("text", {"prompt": PROBE_TEXT}, tokenizer.encode(PROBE_TEXT)),
        ("chat", {"messages": list(PROBE_CHAT), "add_generation_prompt": True},
         tokenizer.encode_chat(PROBE_CHAT)),
    ]
    for name, body, ours in probes:
        try:
            async with session.post(f"{url}/tokenize", json={"model": served_model, **body},
                                    headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if resp.status != 200:
                    return f"token parity: POST /tokenize ({name}) answered HTTP {resp.status}"
                theirs = (await resp.json()).get("tokens")
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError) as exc:
            return f"token parity: POST /tokenize ({name}) failed: {type(exc).__name__}"
        if theirs != ours:
            return (f"token parity: the {name} probe tokenizes differently "
                    f"({_first_difference(ours, theirs)})")
    return None


def _first_difference(ours: list[int], theirs: object) -> str:
    if not isinstance(theirs, list):
        return "no token list"
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return f"position {i}: router {a}, server {b}"
    return f"router {len(ours)} tokens, server {len(theirs)}"
