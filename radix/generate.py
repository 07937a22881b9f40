"""``POST /generate``: the router-to-worker request and the worker's plain answer,
defined once for both sides (the router builds and sends a ``GenerateRequest``, the
worker parses one; the OpenAPI document lists exactly ``WIRE_FIELDS``).

Body: exactly one of ``token_ids`` (a JSON list, for people) and ``token_ids_b64``
(base64 of the prompt's ``radix.keys`` bytes, 4 little-endian bytes per id: what
routers send, a third of the cost of decoding and checking a JSON list), and::

    {"request_id"?, "scope"?, "num_public_tokens"?, "num_resumed_tokens"?,
     "max_cached_tokens"?, "sampling"?, "stream"?, "render"?, "adapter"?,
     "kv_transfer_params"?, "priority"?, "session_id"?, "retention_s"?}

``scope`` defaults to ``direct`` (``radix.tree.DIRECT``, as on a worker's own OpenAI
routes); ``num_public_tokens`` (default 0) is a multiple of the block size, at most
the prompt; ``max_cached_tokens`` is the scope's prefix-cache quota (absent: none);
``adapter`` names a LoRA adapter (absent: the base model); ``sampling`` takes the
fields of ``radix.openai.sampling``. ``num_resumed_tokens`` (default 0, only with
``n`` 1) says the prompt's last that many tokens are output an earlier attempt
already delivered (a router resuming a cut stream): they count as completion tokens
and their text is not sent again. ``render`` (a ``RenderSpec``, streams only) makes
the stream carry the client's OpenAI answer itself (``radix.openai.rendered``).
``kv_transfer_params`` (an object, ``radix.kv_transfer``) makes the request one leg
of a disaggregated prefill/decode pair. ``priority`` (an integer in
``radix.openai.requests``' [``MIN_PRIORITY``, ``MAX_PRIORITY``], default 0 and then
left out of the body) orders the worker's scheduling as vLLM's priority policy does:
lower is admitted first and preempted last. ``session_id`` (at most
``MAX_ID_CHARS``) with ``retention_s`` (seconds, positive) asks the worker to keep the
prompt's cached blocks for that session ahead of LRU that long after the request
(docs/kv-cache.md, "Sessions that return"); either alone changes nothing.

Without ``render`` the answer is plain: streamed, one ``step_event`` per choice per
step, then a ``usage_event``, then ``[DONE]``; whole, ``whole_answer``.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol

import orjson

from radix.api_errors import bad_request
from radix.keys import to_key
from radix.openai.fields import Fields, token_id_list, token_ids_b64
from radix.openai.rendered import RenderSpec
from radix.openai.requests import parse_priority
from radix.openai.responses import TokenUsage
from radix.openai.sampling import Sampling, SamplingBounds, parse_sampling
from radix.tree import DIRECT

PATH = "/generate"
MAX_ID_CHARS = 256
WIRE_FIELDS = ("request_id", "token_ids", "token_ids_b64", "scope", "num_public_tokens",
               "num_resumed_tokens", "max_cached_tokens", "sampling", "stream", "render",
               "adapter", "kv_transfer_params", "priority", "session_id", "retention_s")
MAX_RETENTION_S = 86400.0


@dataclass(frozen=True)
class GenerateRequest:
    """One ``/generate`` request. ``prompt_key`` is the prompt (resumed output
    included) in ``radix.keys`` encoding; ``sampling.max_tokens`` is the cap the worker
    applies. A parsed request is valid for the worker's vocabulary and block size."""

    prompt_key: bytes
    scope: str = DIRECT
    sampling: Sampling = field(default_factory=Sampling)
    stream: bool = False
    render: RenderSpec | None = None
    num_public_tokens: int = 0
    num_resumed_tokens: int = 0
    max_cached_tokens: int | None = None
    request_id: str | None = None
    adapter: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    priority: int = 0
    session_id: str | None = None
    retention_s: float | None = None

    def to_wire(self) -> dict[str, Any]:
        """The JSON body: defaults and absent values left out."""
        return {"token_ids_b64": base64.b64encode(self.prompt_key).decode(),
                **self._wire_fields()}

    def to_json(self) -> bytes:
        """``orjson.dumps(self.to_wire())``, exactly, with the prompt's base64 written
        into the bytes as it is encoded (never made a string and encoded again)."""
        fields = orjson.dumps(self._wire_fields())
        return b'{"token_ids_b64":"%b",%b' % (base64.b64encode(self.prompt_key), fields[1:])

    def _wire_fields(self) -> dict[str, Any]:
        """Every field of the body but the prompt."""
        body: dict[str, Any] = {
            "scope": self.scope, "sampling": self.sampling.to_wire(self.sampling.max_tokens),
            "stream": self.stream}
        if self.render is not None:
            body["render"] = self.render.to_wire()
        optional = (("num_public_tokens", self.num_public_tokens or None),
                    ("num_resumed_tokens", self.num_resumed_tokens or None),
                    ("max_cached_tokens", self.max_cached_tokens),
                    ("request_id", self.request_id), ("adapter", self.adapter),
                    ("kv_transfer_params", self.kv_transfer_params),
                    ("priority", self.priority or None), ("session_id", self.session_id),
                    ("retention_s", self.retention_s))
        body.update((name, value) for name, value in optional if value is not None)
        return body

    def resumed(self, prompt_key: bytes, num_resumed_tokens: int) -> GenerateRequest:
        """This request continued on another worker: ``prompt_key`` now ends with the
        ``num_resumed_tokens`` tokens already delivered."""
        return replace(self, prompt_key=prompt_key, num_resumed_tokens=num_resumed_tokens)

    @staticmethod
    def parse(fields: Fields, bounds: SamplingBounds, block_size: int
              ) -> tuple[GenerateRequest, tuple[int, ...]]:
        """The request in ``fields`` and its prompt's token ids; 400 naming the field on
        anything out of bounds (ids past ``bounds.vocab_size``, a public prefix that is
        not whole blocks, ``render`` without ``stream``, ...)."""
        prompt_key, token_ids = _prompt(fields, bounds.vocab_size)
        num_public = fields.integer("num_public_tokens", 0, lo=0, hi=len(token_ids)) or 0
        if num_public % block_size:
            raise bad_request(f"num_public_tokens must be a multiple of the block size "
                              f"{block_size}", "num_public_tokens")
        num_resumed = fields.integer("num_resumed_tokens", 0, lo=0, hi=len(token_ids) - 1) or 0
        sampling = parse_sampling(fields.object("sampling"), bounds)
        if num_resumed and sampling.n != 1:
            raise bad_request("num_resumed_tokens needs n = 1", "num_resumed_tokens")
        stream = fields.boolean("stream", False)
        render = RenderSpec.parse(fields.object("render")) if fields.has("render") else None
        if render is not None and not stream:
            raise bad_request("render needs stream = true", "render")
        transfer = fields.object("kv_transfer_params").data if fields.has(
            "kv_transfer_params") else None
        request = GenerateRequest(
            prompt_key, fields.string("scope", DIRECT, MAX_ID_CHARS) or DIRECT, sampling,
            stream, render, num_public, num_resumed, fields.integer("max_cached_tokens", None, lo=0),
            fields.string("request_id", None, MAX_ID_CHARS),
            fields.string("adapter", None, MAX_ID_CHARS), transfer, parse_priority(fields),
            fields.string("session_id", None, MAX_ID_CHARS),
            fields.number("retention_s", 0.0, MAX_RETENTION_S, lo_open=True))
        return request, token_ids


def _prompt(fields: Fields, vocab_size: int) -> tuple[bytes, tuple[int, ...]]:
    """The prompt's key and token ids; 400 unless exactly one of ``token_ids`` and
    ``token_ids_b64`` is given."""
    if fields.has("token_ids_b64"):
        if fields.has("token_ids"):
            raise bad_request("give exactly one of token_ids and token_ids_b64", "token_ids")
        return token_ids_b64(fields.raw("token_ids_b64"), "token_ids_b64", vocab_size)
    token_ids = token_id_list(fields.raw("token_ids"), "token_ids", vocab_size)
    return to_key(token_ids), token_ids


class Choice(Protocol):
    """One choice's tokens and text so far (an engine's delta or finished choice)."""

    index: int
    token_ids: Sequence[int]
    text: str
    finish_reason: str | None


class Step(NamedTuple):
    """A ``Choice`` as a plain value."""

    index: int
    token_ids: Sequence[int]
    text: str
    finish_reason: str | None


def step_event(request_id: str, step: Choice) -> dict[str, Any]:
    """One step of a choice in a plain stream."""
    return {"request_id": request_id, "index": step.index, "token_ids": list(step.token_ids),
            "text": step.text, "finish_reason": step.finish_reason}


def usage_event(request_id: str, usage: TokenUsage) -> dict[str, Any]:
    """The last event of a plain stream before ``[DONE]``."""
    return {"request_id": request_id, "usage": usage._asdict()}


def whole_answer(request_id: str, choices: Sequence[Choice], usage: TokenUsage
                 ) -> dict[str, Any]:
    """A whole plain answer: every choice with all its tokens and text."""
    return {"request_id": request_id,
            "choices": [{"index": c.index, "token_ids": list(c.token_ids), "text": c.text,
                         "finish_reason": c.finish_reason} for c in choices],
            "usage": usage._asdict()}
