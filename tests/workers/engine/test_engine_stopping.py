"""Stop conditions: max_tokens, stop token ids, EOS, stop strings (with hold-back)."""

from __future__ import annotations

from tests.workers.engine.engine_support import demo_model, make_engine, prompt, request, run
from workers.engine.request import GenerationParams
from workers.engine.stopping import StepText, StopChecker
from workers.model.sampler import SamplingParams


def checker(stop: tuple[str, ...] = (), max_tokens: int = 100, ignore_eos: bool = False,
            stop_token_ids: tuple[int, ...] = (), max_total_tokens: int = 1000) -> StopChecker:
    tokenizer = demo_model().tokenizer
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, stop_token_ids=stop_token_ids)
    return StopChecker(tokenizer, GenerationParams(sampling, 1, stop), tokenizer.eos_token_ids,
                       max_total_tokens)


def feed(stop_checker: StopChecker, text: str) -> list[StepText]:
    """Append the bytes of ``text`` (demo tokens are bytes) until the checker stops."""
    steps: list[StepText] = []
    for byte in text.encode():
        steps.append(stop_checker.append(byte, 10))
        if steps[-1].finish_reason is not None:
            break
    return steps


def test_stop_string_cuts_text_and_holds_back_possible_starts():
    steps = feed(checker(stop=("lo w",)), "hello world")
    texts = [step.text for step in steps]
    assert texts == ["", "", "", "h", "e", "l", ""], "3 characters (len('lo w') - 1) held back"
    assert "".join(texts) == "hel"
    assert steps[-1].finish_reason == "stop" and len(steps) == len("hello w")


def test_text_without_stop_strings_streams_immediately():
    steps = feed(checker(), "abc")
    assert [step.text for step in steps] == ["a", "b", "c"]
    assert all(step.finish_reason is None for step in steps)


def test_max_tokens_and_context_limit_finish_with_length():
    stop_checker = checker(max_tokens=3, stop=("zz",))
    steps = feed(stop_checker, "xyz")
    assert [s.finish_reason for s in steps] == [None, None, "length"]
    assert "".join(s.text for s in steps) == "xyz", "held-back text is flushed at the end"
    limited = checker(max_total_tokens=12)
    assert limited.append(ord("a"), 11).finish_reason is None
    assert limited.append(ord("b"), 12).finish_reason == "length"


def test_eos_and_stop_token_ids_stop_without_text():
    eos = demo_model().tokenizer.eos_token_ids[0]
    stop_checker = checker()
    assert stop_checker.append(ord("a"), 5).text == "a"
    assert stop_checker.append(eos, 6) == StepText("", "stop")
    ignoring = checker(ignore_eos=True)
    assert ignoring.append(eos, 5).finish_reason is None
    by_id = checker(ignore_eos=True, stop_token_ids=(ord("q"),))
    step = by_id.append(ord("q"), 5)
    assert (step.text, step.finish_reason) == ("", "stop")


def test_engine_stops_on_token_id_and_on_string():
    engine = make_engine()
    full = run(engine, {0: request(prompt(20), max_tokens=12)})[0]
    tokens, text = full.token_ids[0], full.text[0]
    assert full.finish_reason[0] == "length" and len(tokens) == 12
    stop_id = tokens[3]
    by_id = run(engine, {1: request(prompt(20), max_tokens=12, stop_token_ids=(stop_id,))})[1]
    assert by_id.token_ids[0] == tokens[: tokens.index(stop_id) + 1]
    assert by_id.finish_reason[0] == "stop"
    assert by_id.usage.completion_tokens == tokens.index(stop_id) + 1
    stop = text[4:6]
    by_text = run(engine, {2: request(prompt(20), max_tokens=12, stop=(stop,))})[2]
    assert by_text.text[0] == text[: text.index(stop)]
    assert by_text.finish_reason[0] == "stop"
