"""Engine-side state of requests and their sequences (one sequence per choice).

A ``Sequence`` is what the scheduler and the KV manager see: token ids (prompt then
output) and their radix key (``key``, encoded once per token). How many of them have
KV is the KV manager's count (``KVCacheManager.num_computed_tokens``), the only one:
a sequence that is not admitted has none, so everything is still to be computed (the
whole prompt when new, everything again after a preemption). A sampled token is
appended only when a step computed the sequence up to its last token.

Only the engine thread touches these objects.
"""

from __future__ import annotations

from enum import Enum

from radix.keys import TOKEN_BYTES, to_key
from workers.engine.request import FinishReason, GenerationRequest
from workers.engine.stopping import StopChecker


class SequenceStatus(Enum):
    """Where a sequence is: queued for admission, holding blocks, or done."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class RequestState:
    """One request in the engine: its sequences and its accounting.

    Before the prompt is prefilled a request has one sequence; an ``n > 1`` request
    forks it into ``n`` once the prefill is done (the children share its blocks).
    For its trace line: ``num_host_cached_tokens`` of its first admission's cached
    tokens came back from the host tier, its admissions evicted
    ``num_admission_evicted_blocks`` cached blocks, and its sequences were preempted
    ``num_preemptions`` times.
    ``namespace`` is the digest of its adapter's cache namespace (None: the base
    model's); ``lora_slot`` the adapter slot it pinned at its first admission.
    """

    def __init__(self, request_id: int, request: GenerationRequest, arrival_time: float) -> None:
        self.request_id = request_id
        self.request = request
        self.arrival_time = arrival_time
        self.num_cached_tokens: int | None = None
        self.sequences: list[Sequence] = []
        self.is_forked = request.params.n == 1
        self.namespace: bytes | None = None
        self.lora_slot: int | None = None
        self.num_host_cached_tokens = 0
        self.num_admission_evicted_blocks = 0
        self.num_preemptions = 0

    @property
    def num_prompt_tokens(self) -> int:
        """Length of the prompt, without the resumed output at its end."""
        return len(self.request.prompt_token_ids) - self.request.num_resumed_tokens

    @property
    def is_finished(self) -> bool:
        """True once every choice has finished (all ``n`` exist and are done)."""
        return self.is_forked and all(s.status is SequenceStatus.FINISHED for s in self.sequences)

    def num_completion_tokens(self) -> int:
        """Output tokens over all choices."""
        return sum(s.num_output_tokens for s in self.sequences)


class Sequence:
    """One choice of a request: token ids, their key, stop state, and its place in the
    scheduling ``order``: (its request's priority, its request's arrival time, its own
    id), smallest first. Admission takes waiting sequences in that order and
    preemption takes the largest running one first, as vLLM's priority policy does;
    with every priority equal it is first come, first served (the ids of one
    request's choices break the tie of their shared arrival)."""

    __slots__ = (
        "seq_id",
        "order",
        "request",
        "index",
        "token_ids",
        "_key",
        "status",
        "stop_checker",
        "seed",
        "finish_reason",
        "last_token_time",
    )

    def __init__(
        self,
        seq_id: int,
        request: RequestState,
        index: int,
        token_ids: list[int],
        stop_checker: StopChecker,
        seed: int | None,
        key: bytes = b"",
    ) -> None:
        self.seq_id = seq_id
        self.order = (request.request.priority, request.arrival_time, seq_id)
        self.request = request
        self.index = index
        self.token_ids = token_ids
        self._key = key
        self.status = SequenceStatus.WAITING
        self.stop_checker = stop_checker
        self.seed = seed
        self.finish_reason: FinishReason | None = None
        self.last_token_time: float | None = None

    def key(self, num_tokens: int) -> bytes:
        """The radix key (``radix.keys.to_key``) of the first ``num_tokens`` token ids.
        Each token is encoded once: the key given at construction (a prefix of the
        tokens' key, e.g. the bytes a request arrived as) is extended only by the
        tokens not encoded before."""
        key = self._key
        num_known = len(key) // TOKEN_BYTES
        if num_tokens > num_known:
            key = self._key = key + to_key(self.token_ids[num_known:num_tokens])
        return key if len(key) == num_tokens * TOKEN_BYTES else key[: num_tokens * TOKEN_BYTES]

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_ids) - self.request.num_prompt_tokens

    def append_token(self, token_id: int, now: float) -> None:
        """Add one sampled token (its KV is computed by the next step) sampled at
        ``now`` (``time.monotonic``)."""
        self.token_ids.append(token_id)
        self.last_token_time = now

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, status={self.status.value}, "
            f"tokens={len(self.token_ids)})"
        )
