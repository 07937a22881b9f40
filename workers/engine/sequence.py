"""Engine-side state of requests and their sequences (one sequence per choice).

A ``Sequence`` is what the scheduler and the KV manager see: token ids (prompt then
output) and how many of them have KV written (``num_computed_tokens``). The tokens
``[num_computed_tokens, len(token_ids))`` are still to be computed: the whole prompt
when new, a chunk's remainder during chunked prefill, the last sampled token while
decoding, and everything again after a preemption (recompute). A sampled token is
appended only when a step computed the sequence up to its last token.

Only the engine thread touches these objects.
"""

from __future__ import annotations

import time
from enum import Enum

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
    """

    def __init__(self, request_id: int, request: GenerationRequest, arrival_time: float) -> None:
        self.request_id = request_id
        self.request = request
        self.arrival_time = arrival_time
        self.num_cached_tokens: int | None = None
        self.sequences: list[Sequence] = []
        self.is_forked = request.params.n == 1

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
    """One choice of a request: token ids, KV progress and stop state."""

    __slots__ = (
        "seq_id",
        "request",
        "index",
        "token_ids",
        "num_computed_tokens",
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
    ) -> None:
        self.seq_id = seq_id
        self.request = request
        self.index = index
        self.token_ids = token_ids
        self.num_computed_tokens = 0
        self.status = SequenceStatus.WAITING
        self.stop_checker = stop_checker
        self.seed = seed
        self.finish_reason: FinishReason | None = None
        self.last_token_time: float | None = None

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens whose KV is not written yet (at least 1 while unfinished)."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_ids) - self.request.num_prompt_tokens

    def append_token(self, token_id: int) -> None:
        """Add one sampled token (its KV is computed by the next step)."""
        self.token_ids.append(token_id)
        self.last_token_time = time.monotonic()

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, status={self.status.value}, "
            f"computed={self.num_computed_tokens}/{len(self.token_ids)})"
        )
