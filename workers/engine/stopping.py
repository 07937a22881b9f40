"""Per-choice stop conditions and detokenization.

``StopChecker.append`` takes each sampled token and says what text became final and
whether the choice is done. Text that could still turn into a stop string is held
back (at most ``max(len(stop)) - 1`` characters), so a streamed response never shows
text that a later token reveals to be part of a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radix.tokenizer import IncrementalDecoder, PromptTokenizer
from workers.engine.request import FinishReason, GenerationParams


@dataclass(frozen=True)
class StepText:
    """Result of one appended token: final text and the finish reason, if any."""

    text: str
    finish_reason: FinishReason | None


class StopChecker:
    """Decides when one choice stops and which of its text is final.

    Guarantees: ``max_tokens`` (and ``max_total_tokens``, the context limit) stop with
    "length"; a stop token (``stop_token_ids``, or EOS unless ``ignore_eos``) stops with
    "stop" and adds no text; a stop string stops with "stop" and cuts the text just
    before it. Once finished, ``append`` must not be called again.
    """

    def __init__(
        self,
        tokenizer: PromptTokenizer,
        params: GenerationParams,
        eos_token_ids: tuple[int, ...],
        max_total_tokens: int,
    ) -> None:
        self._decoder = IncrementalDecoder(tokenizer)
        self._stop_strings = params.stop
        self._holdback = max((len(s) for s in params.stop), default=1) - 1
        sampling = params.sampling
        ids = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            ids.update(eos_token_ids)
        self._stop_ids = frozenset(ids)
        self._max_tokens = sampling.max_tokens
        self._max_total_tokens = max_total_tokens
        self._pending = ""
        self.num_output_tokens = 0

    def append(self, token_id: int, num_total_tokens: int) -> StepText:
        """Account for one sampled token; ``num_total_tokens`` counts prompt and output."""
        self.num_output_tokens += 1
        if token_id in self._stop_ids:
            return self._finish("stop")
        self._pending += self._decoder.feed((token_id,))
        if self._stop_strings and self._find_stop(self._pending) is not None:
            return self._finish("stop")
        if self.num_output_tokens >= self._max_tokens or num_total_tokens >= self._max_total_tokens:
            return self._finish("length")
        return StepText(self._take_final(), None)

    def replay(self, token_ids: Sequence[int], num_prompt_tokens: int) -> str:
        """Account for output tokens an earlier attempt already delivered (a resumed
        request), leaving the state ``append`` would have left, and return their final
        text (what the client already has: the caller does not send it again); text
        still held back stays pending, so no character is lost or repeated across the
        seam. None of them may finish."""
        texts = []
        for i, token_id in enumerate(token_ids):
            step = self.append(token_id, num_prompt_tokens + i + 1)
            if step.finish_reason is not None:
                raise ValueError(f"resumed output token {i} already ends the completion")
            texts.append(step.text)
        return "".join(texts)

    def _finish(self, reason: FinishReason) -> StepText:
        text = self._pending + self._decoder.flush()
        self._pending = ""
        cut = self._find_stop(text)
        return StepText(text, reason) if cut is None else StepText(text[:cut], "stop")

    def _find_stop(self, text: str) -> int | None:
        positions = [p for p in (text.find(s) for s in self._stop_strings) if p >= 0]
        return min(positions) if positions else None

    def _take_final(self) -> str:
        if not self._holdback:
            text, self._pending = self._pending, ""
            return text
        keep = min(self._holdback, len(self._pending))
        final_len = len(self._pending) - keep
        text, self._pending = self._pending[:final_len], self._pending[final_len:]
        return text
