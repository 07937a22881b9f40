"""The rendered ``/generate`` stream: the worker writes the client's OpenAI bytes and
the router passes them through.

A ``/generate`` body with ``"render": RenderSpec.to_wire()`` (and ``"stream": true``)
asks the worker for the client's answer itself, shaped by ``radix.openai.responses``
under the router's ``id``, ``created`` and model name, so the bytes have the same
identity whichever worker serves or resumes the request. The answer is SSE; each step
of each choice is one event::

    tokens: {"index":0,"token_ids":[...],"finish_reason":null}
    data: <the client's chunk>       (only when the step shows the client something)

and the end is::

    usage: {"prompt_tokens":P,"completion_tokens":C,"cached_tokens":K}
    data: <usage chunk> | <whole body>   (the usage chunk only with include_usage;
                                          the whole body when the client did not stream)

    data: [DONE]

Errors are ``data: {"error": ...}`` events, as in the plain stream. The router reads
only the ``tokens`` and ``usage`` lines (small JSON: what it keeps for resume and
accounting) and copies the answer's ``data`` lines (they start with ``{"id":``, as
every object ``ResponseShape`` renders does) to the client byte for byte. SSE clients
ignore fields they do not know, so the stream is also a plain OpenAI stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from radix.api_errors import bad_request
from radix.openai.fields import Fields
from radix.openai.requests import CHAT, COMPLETIONS
from radix.openai.responses import ChoiceText, ResponseShape, TokenUsage, sse_frame

TOKENS_PREFIX = b"tokens: "
USAGE_PREFIX = b"usage: "
DATA_PREFIX = b"data: "
ANSWER_PREFIX = b'data: {"id":'  # every object ResponseShape renders starts with its id
MAX_RESPONSE_ID_CHARS = 128
MAX_MODEL_NAME_CHARS = 256


@dataclass(frozen=True)
class RenderSpec:
    """How the client's answer looks: its endpoint, ``id``, ``created`` and model name
    (the router's, constant across attempts), whether the client streams, and whether
    a stream ends with a usage chunk."""

    endpoint: str
    response_id: str
    created: int
    model: str
    stream: bool
    include_usage: bool

    @staticmethod
    def of(shape: ResponseShape, stream: bool, include_usage: bool) -> RenderSpec:
        """The spec that renders what ``shape`` would."""
        return RenderSpec(shape.endpoint, shape.id, shape.created, shape.model, stream,
                          include_usage)

    def to_wire(self) -> dict[str, object]:
        """The ``render`` object of a ``/generate`` body."""
        return {"endpoint": self.endpoint, "id": self.response_id, "created": self.created,
                "model": self.model, "stream": self.stream,
                "include_usage": self.include_usage}

    @staticmethod
    def parse(fields: Fields) -> RenderSpec:
        """The spec in ``fields`` (a ``render`` object); 400 naming the bad field."""
        fields.only(("endpoint", "id", "created", "model", "stream", "include_usage"))
        endpoint = fields.string("endpoint", None)
        if endpoint not in (COMPLETIONS, CHAT):
            raise bad_request(f"{fields.param('endpoint')} must be {COMPLETIONS!r} or {CHAT!r}",
                              fields.param("endpoint"))
        response_id = fields.string("id", None, MAX_RESPONSE_ID_CHARS)
        model = fields.string("model", None, MAX_MODEL_NAME_CHARS)
        created = fields.integer("created", None, lo=0, hi=2**53)
        for name, value in (("id", response_id), ("model", model), ("created", created)):
            if value is None:
                raise bad_request(f"{fields.param(name)} is required", fields.param(name))
        assert response_id is not None and model is not None and created is not None
        return RenderSpec(endpoint, response_id, created, model,
                          fields.boolean("stream", False), fields.boolean("include_usage", False))


class RenderedAnswer:
    """One request's rendered stream, produced step by step. ``resumed_text`` is the
    text an earlier attempt already delivered (a resume, one choice): a whole body
    starts with it and a chat stream sends no second ``role``."""

    def __init__(self, spec: RenderSpec, resumed_text: str = "") -> None:
        self._spec = spec
        self._shape = ResponseShape(spec.endpoint, spec.model, spec.response_id, spec.created)
        self._texts: dict[int, list[str]] = {}
        self._finish_reasons: dict[int, str | None] = {}
        if resumed_text:
            self._shape.mark_started(0)
            self._texts[0] = [resumed_text]

    def step(self, index: int, token_ids: Sequence[int], text: str,
             finish_reason: str | None) -> bytes:
        """The event of one step of choice ``index``."""
        head = tokens_line(index, token_ids, finish_reason)
        if self._spec.stream:
            return head + (self._shape.chunk(index, text, finish_reason) or b"\n")
        self._texts.setdefault(index, []).append(text)
        self._finish_reasons[index] = finish_reason
        return head + b"\n"

    def end(self, usage: TokenUsage) -> bytes:
        """The last event before ``[DONE]``: usage, and the usage chunk or whole body."""
        head = USAGE_PREFIX + orjson.dumps(usage._asdict()) + b"\n"
        if self._spec.stream:
            return head + (self._shape.usage_chunk(usage) if self._spec.include_usage else b"\n")
        choices = [ChoiceText(i, "".join(self._texts[i]), self._finish_reasons.get(i))
                   for i in sorted(self._texts)]
        return head + sse_frame(self._shape.whole(choices, usage))


def rendered_answer(body: dict[str, object], resumed_text: str = "") -> RenderedAnswer:
    """The answer a ``/generate`` body's ``render`` object asks for (400 naming the bad
    field)."""
    return RenderedAnswer(RenderSpec.parse(Fields(body).object("render")), resumed_text)


def tokens_line(index: int, token_ids: Sequence[int], finish_reason: str | None) -> bytes:
    """The ``tokens`` line of one step (ends with its newline)."""
    return (TOKENS_PREFIX + orjson.dumps({"index": index, "token_ids": list(token_ids),
                                          "finish_reason": finish_reason}) + b"\n")


def parse_usage(line: bytes) -> TokenUsage:
    """A ``usage`` line's counts; ``ValueError``/``KeyError``/``TypeError`` if malformed."""
    usage = orjson.loads(line[len(USAGE_PREFIX):])
    return TokenUsage(int(usage["prompt_tokens"]), int(usage["completion_tokens"]),
                      int(usage["cached_tokens"]))
