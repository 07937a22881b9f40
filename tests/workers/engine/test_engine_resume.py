"""Resuming a request from its delivered output: a request whose prompt ends with
the first K generated tokens (``num_resumed_tokens`` K) continues exactly where the
undisturbed run went on, for greedy and seeded sampling, with no text lost or
repeated across the seam (held-back text included) and usage of the whole run."""

from __future__ import annotations

import dataclasses

import pytest

from tests.workers.engine.engine_support import make_engine, prompt, request

PROMPT = prompt(21, salt=3)
# A long stop string that never matches holds back up to 31 characters of text, so
# most seams fall where text is still pending.
NEVER = ("\x00never-matches-this-stop-string",)


def per_token_run(req) -> tuple[list[int], list[str], object]:
    """Token ids, the text each token's step released, and the usage of ``req``."""
    engine = make_engine()
    engine.add_request(0, req)
    token_ids, texts, usage = [], [], None
    while engine.has_work():
        for output in engine.step().values():
            for delta in output.deltas:
                token_ids.extend(delta.token_ids)
                texts.append(delta.text)
            usage = output.usage or usage
        engine.manager.check_invariants()
    return token_ids, texts, usage


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 1234}],
                         ids=["greedy", "seeded"])
@pytest.mark.parametrize("stop", [(), NEVER], ids=["no-stop", "held-back"])
def test_a_resumed_request_continues_the_undisturbed_run(sampling, stop) -> None:
    full = request(PROMPT, max_tokens=24, stop=stop, **sampling)
    token_ids, texts, usage = per_token_run(full)
    assert len(token_ids) == 24
    for k in (1, 7, 23):
        resumed = dataclasses.replace(full, prompt_token_ids=PROMPT + tuple(token_ids[:k]),
                                      num_resumed_tokens=k)
        rest_ids, rest_texts, rest_usage = per_token_run(resumed)
        assert rest_ids == token_ids[k:]
        assert "".join(texts[:k]) + "".join(rest_texts) == "".join(texts)
        assert rest_usage.prompt_tokens == usage.prompt_tokens == len(PROMPT)
        assert rest_usage.completion_tokens == 24
        assert rest_usage.cached_tokens <= len(PROMPT)


def test_seeded_tokens_depend_on_seed_and_position_only() -> None:
    """The same seed draws the same token at the same absolute position, whatever came
    before it in the batch or in the generator's history; another seed differs."""
    seeded = request(PROMPT, max_tokens=16, temperature=1.0, seed=7)
    first, _, _ = per_token_run(seeded)
    assert first == per_token_run(seeded)[0]
    other, _, _ = per_token_run(dataclasses.replace(
        seeded, params=dataclasses.replace(seeded.params, sampling=dataclasses.replace(
            seeded.params.sampling, seed=8))))
    assert other != first
