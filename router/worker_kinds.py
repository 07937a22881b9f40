"""What the router may ask of each kind of worker: the one place a configured
``kind`` becomes capabilities.

Every other module asks a capability (``worker.capabilities.speaks_generate``),
never compares the kind's name, so a new engine is one entry in ``WORKER_KINDS``
whose capabilities say which paths it takes: ``sglang`` was (docs/sglang.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class EventSource(enum.Enum):
    """Where a worker's KV events come from, if anywhere."""

    OWN_STREAM = "own"  # ours: GET /kv/events, with an epoch and a snapshot
    ZMQ_WHEN_CONFIGURED = "zmq"  # vLLM's (or SGLang's) PUB stream, when the worker names its endpoints
    NONE = "none"  # never: the index learns only what routers sent there


@dataclass(frozen=True)
class WorkerKind:
    """The capabilities of one kind of worker.

    ``speaks_generate``: it serves ``POST /generate`` (token ids in, rendered OpenAI
    bytes out), is probed on ``/ready`` and ``/info``, and takes prefill/decode legs;
    otherwise it gets ``/v1/completions`` with the validated fields and a tenant's
    ``cache_salt``. ``resumable``: a stream cut after its first byte can go on there
    from the tokens already sent. ``events``: where its KV events come from.
    ``routed_approximately``: it never publishes events, so routers share what they
    route to it (the siblings' routed stream). ``masks_answers``: its model name and
    error texts are never shown to a client (``router.forward.masking``)."""

    name: str
    speaks_generate: bool
    resumable: bool
    events: EventSource
    routed_approximately: bool
    masks_answers: bool


WORKER_KINDS = {
    "radix": WorkerKind("radix", speaks_generate=True, resumable=True,
                        events=EventSource.OWN_STREAM, routed_approximately=False,
                        masks_answers=False),
    "vllm": WorkerKind("vllm", speaks_generate=False, resumable=False,
                       events=EventSource.ZMQ_WHEN_CONFIGURED, routed_approximately=False,
                       masks_answers=False),
    "sglang": WorkerKind("sglang", speaks_generate=False, resumable=False,
                         events=EventSource.ZMQ_WHEN_CONFIGURED, routed_approximately=False,
                         masks_answers=False),
    "openai": WorkerKind("openai", speaks_generate=False, resumable=False,
                         events=EventSource.NONE, routed_approximately=True,
                         masks_answers=True),
}
