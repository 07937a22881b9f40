"""What goes into the engine (a validated request) and what comes out (per-step outputs).

These are the engine's boundary values: frozen, built by the HTTP layer after
validation, consumed by the engine thread, and handed back to the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from radix.keys import TOKEN_BYTES
from radix.tree import DIRECT
from workers.model.sampler import SamplingParams

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class GenerationParams:
    """How to generate: per-token sampling, number of choices and stop strings.

    ``sampling`` carries temperature, top-p/top-k, seed, ``max_tokens``, stop token
    ids and ``ignore_eos`` (validated by ``SamplingParams``). With a seed, the token
    of choice ``i`` at absolute position ``p`` is drawn with seed ``seed + i`` at
    position ``p`` (``workers.model.sampler.position_generator``).
    Generation stops at ``max_tokens`` output tokens ("length"), or ("stop") at a
    stop token id, at EOS unless ``ignore_eos``, or when the text contains one of
    ``stop`` (the text is cut before it).
    """

    sampling: SamplingParams
    n: int = 1
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """A prompt as token ids, the cache scope it may see, and how to generate.

    ``num_public_tokens`` leading tokens are inserted into the prefix cache as
    public (a multiple of the block size, at most the prompt length).
    ``num_resumed_tokens`` trailing prompt tokens are output an earlier attempt of this
    request already delivered (a resume: ``n`` is then 1): they count as completion
    tokens in ``max_tokens``, stop strings and usage, and their text is not sent again.
    ``max_cached_tokens`` is the scope's prefix-cache quota (None: none).
    ``adapter`` names the LoRA adapter the request runs (None: the base model); its
    KV lives in the adapter's own cache namespace.
    ``prompt_key`` is the prompt's radix key (``radix.keys.to_key``) when the caller
    already holds it (``/generate`` keeps the bytes of ``token_ids_b64``), so the
    engine never encodes the prompt again; None: encoded at admission. Its length is
    checked, its content is the caller's guarantee. ``request_id`` is the caller's id
    for the request (the router's), carried into the trace line; None: the engine's.
    ``priority`` orders scheduling as vLLM's priority policy does: waiting sequences
    are admitted by (priority, arrival), and the running sequence with the largest
    (priority, arrival) is preempted first (lower runs first; 0 by default).
    """

    prompt_token_ids: tuple[int, ...]
    params: GenerationParams
    scope: str = DIRECT
    num_public_tokens: int = 0
    num_resumed_tokens: int = 0
    max_cached_tokens: int | None = None
    prompt_key: bytes | None = None
    adapter: str | None = None
    request_id: str | None = None
    priority: int = 0

    def __post_init__(self) -> None:
        key = self.prompt_key
        if key is not None and len(key) != TOKEN_BYTES * len(self.prompt_token_ids):
            raise ValueError(f"prompt_key has {len(key)} bytes for "
                             f"{len(self.prompt_token_ids)} prompt tokens")


@dataclass(frozen=True)
class ChoiceDelta:
    """What one choice produced in one step: new token ids, new text (held back while
    it could still become a stop string), and the finish reason on its last step."""

    index: int
    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None = None


@dataclass(frozen=True)
class Usage:
    """Token accounting of a finished request; ``cached_tokens`` is the prefix-cache
    hit of its first admission."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class RequestOutput:
    """One step's news for one request. The last output, and only it, has ``finished``
    True: it carries ``usage`` when the request completed, or ``error`` (what failed,
    for the client; the detail is in the worker log) when it failed alone."""

    deltas: tuple[ChoiceDelta, ...]
    usage: Usage | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        """True on the request's last output."""
        return self.usage is not None or self.error is not None


class UnknownAdapterError(LookupError):
    """The request names a LoRA adapter the worker does not have (any more: unloaded
    between the server's check and the engine's queue). The client's error (404),
    never the engine's; nothing was allocated for the request."""


class EngineError(RuntimeError):
    """The engine failed while running a request (a bug or a device fault, never bad
    input); the request's blocks have been released."""
