"""Decoding an OpenAI request body: what the router runs against ``msgspec``.

``python -m bench.body_parse [--number N]`` times, in this process (CPU time, the
best of seven rounds of ``N`` calls), three ways to turn the bytes of the
``router_overhead`` scenarios' bodies (a repeated document, a 10-turn chat) into a
validated request:

- ``orjson + fields``: ``decode_json_object`` then ``parse_openai_request``, what
  ``router.front.requests`` runs (every refusal a 400 naming the field);
- ``msgspec + fields``: ``msgspec.json.decode`` to plain objects, then the same
  validation (what changing the JSON parser alone would give);
- ``msgspec typed``: a ``msgspec.Struct`` decode of the same fields with their types
  and main bounds, no further checks: a lower bound for a typed front end, which would
  still need the hand validation for its error messages (msgspec words its own).
"""

from __future__ import annotations

import argparse
import time
import timeit
from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec
import orjson

from bench.overhead_load import prompts
from radix.openai.json_body import decode_json_object
from radix.openai.requests import CHAT, COMPLETIONS, MAX_MESSAGES, parse_openai_request
from radix.openai.sampling import MAX_TOKENS_LIMIT, SamplingBounds

BOUNDS = SamplingBounds(vocab_size=49152)
MaxTokens = Annotated[int, msgspec.Meta(ge=1, le=MAX_TOKENS_LIMIT)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class _Options(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool | None = None


class _Message(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None


class _Common(msgspec.Struct, forbid_unknown_fields=True):
    model: Name | None = None
    max_tokens: MaxTokens | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=16)] | None = None
    stream: bool | None = None
    stream_options: _Options | None = None
    user: Name | None = None
    priority: int | None = None


class _Completion(_Common, forbid_unknown_fields=True):
    prompt: str | list[int] | None = None


class _Chat(_Common, forbid_unknown_fields=True):
    messages: Annotated[list[_Message], msgspec.Meta(min_length=1,
                                                     max_length=MAX_MESSAGES)] = []
    max_completion_tokens: MaxTokens | None = None


def bodies() -> dict[str, tuple[str, bytes]]:
    """Scenario -> (endpoint, body bytes), as the overhead benchmark sends them."""
    document = prompts(20, "repeat")[5]
    chat = prompts(100, "chat")[95]
    return {"repeated document": (COMPLETIONS, orjson.dumps(
                {"model": "demo", "prompt": document, "max_tokens": 16})),
            "chat, turn 10": (CHAT, orjson.dumps(
                {"model": "demo", "messages": chat, "max_tokens": 16}))}


def ways(endpoint: str, raw: bytes) -> dict[str, Callable[[], Any]]:
    """The three decoders of ``raw`` (see the module docstring)."""
    typed = msgspec.json.Decoder(_Chat if endpoint == CHAT else _Completion)
    return {
        "orjson + fields": lambda: parse_openai_request(
            decode_json_object(raw), endpoint, BOUNDS, allow_priority=True),
        "msgspec + fields": lambda: parse_openai_request(
            msgspec.json.decode(raw), endpoint, BOUNDS, allow_priority=True),
        "msgspec typed": lambda: typed.decode(raw),
    }


def cpu_us(call: Callable[[], Any], number: int) -> float:
    """CPU microseconds per call: the best of seven rounds."""
    timer = timeit.Timer(call, timer=time.process_time)
    return 1e6 * min(timer.repeat(repeat=7, number=number)) / number


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Time every way on every body; print and return CPU us per body."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--number", type=int, default=2000, help="calls per round")
    args = parser.parse_args(argv)
    results = {}
    for name, (endpoint, raw) in bodies().items():
        results[name] = {way: cpu_us(call, args.number)
                         for way, call in ways(endpoint, raw).items()}
        print(f"{name} ({len(raw)} bytes): " + ", ".join(
            f"{way} {us:.1f} us" for way, us in results[name].items()))
    return results


if __name__ == "__main__":
    main()
