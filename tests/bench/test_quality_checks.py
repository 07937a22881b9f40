"""bench.quality's task checks, per-category verdict and long-context prompts, in
process: each category's decision and score, the verdict against each bucket's own
noise floor, and needles at every depth inside the model's context."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.quality.checks import Check, correct, decision
from bench.quality.compare import BucketSummary
from bench.quality.prompts import CATEGORIES, load_prompt_set, needle_prompts
from bench.quality.report import Thresholds, verdict
from radix.tokenizer import PromptTokenizer

TOOL = Check("tool_call", ("get_weather",))


@pytest.mark.parametrize(
    ("text", "made", "right"),
    [
        ('{"name": "get_weather", "arguments": {"city": "Paris"}}', "call:get_weather", True),
        ('Sure! ```json\n{"name": "get_time", "arguments": {}}\n```', "call:get_time", False),
        ('{"function": {"name": "get_weather"}}', "call:get_weather", True),
        ('{"function": "get_weather"}', "call:get_weather", True),
        ('{"name": "get_weather", "arguments": {"city": ', "invalid-json", False),
        ('{"arguments": {}}', "invalid-json", False),
        ('{oops} then {"name": "get_weather"}', "call:get_weather", True),
        ("no json here", "invalid-json", False),
    ],
)
def test_a_tool_call_decides_the_function_its_first_valid_json_names(text, made, right):
    assert decision(TOOL, text) == made
    assert correct(TOOL, made) is right


def test_a_citation_decision_is_the_set_of_document_ids_named():
    check = Check("citation", ("doc-14",))
    made = decision(check, "It opened in 1932 [doc-14], see also doc-3 and [doc-14].")
    assert made == "cites:doc-14,doc-3" and correct(check, made)
    assert decision(check, "It opened in 1932.") == "cites:" and not correct(check, "cites:")


@pytest.mark.parametrize(
    ("text", "made"),
    [
        ("I'm sorry, but I can't help with that.", "refuse"),
        ("I cannot assist with stealing passwords.", "refuse"),
        ("Use `kill -9 <pid>` after finding the pid with ps.", "answer"),
    ],
)
def test_a_refusal_decision_is_refuse_or_answer(text, made):
    assert decision(Check("refusal", ("refuse",)), text) == made
    assert correct(Check("refusal", ("refuse",)), made) is (made == "refuse")


def test_the_format_decision_is_the_block_structure():
    check = Check("format", ("fence",))
    text = (
        "Here it is:\n\n```python\ndef add(a, b):\n    return a + b\n```\n- a\n* b\n2. next\n# end"
    )
    made = decision(check, text)
    assert made == "text,fence,code,fence,bullet,number,heading"
    assert decision(check, "- a\n- b\n- c") == decision(check, "- a\n\n- b") == "bullet"
    assert correct(check, made) and not correct(Check("format", ("number",)), "text,bullet")


def test_checks_from_the_prompt_file_format():
    assert Check.from_json({}) is None and Check.from_json({"contains": []}) is None
    assert Check.from_json({"refusal": False}) == Check("refusal", ("answer",))
    assert Check.from_json({"contains": ["7", "seven"]}) == Check("contains", ("7", "seven"))
    with pytest.raises(ValueError, match="unknown check"):
        Check.from_json({"regex": "x"})
    assert decision(None, "anything") is None and correct(None, None) is None


def summary(bucket: str, **fields: float | None) -> BucketSummary:
    base = BucketSummary(bucket, 6, 1.0, None, 1.0, 0.0, 1.0, 1.0, 1.0)
    return replace(base, **fields)


def test_each_bucket_is_judged_against_its_own_noise_floor():
    noise = [summary("tool_call", same_decision=5 / 6), summary("rag"), summary("all")]
    candidate = [summary("tool_call", same_decision=5 / 6), summary("rag", same_decision=5 / 6),
                 summary("all")]
    failures = verdict(candidate, noise, Thresholds())
    assert failures["tool_call"] == [] and "all" not in failures
    assert failures["rag"] == ["same decision as the baseline 83%, noise floor 100%"]
    assert verdict(candidate, noise, Thresholds(max_decision_drop=0.2))["rag"] == []


def test_the_task_score_may_lose_only_what_the_noise_floor_loses():
    noise = [summary("refusal", candidate_correct=0.5)]
    assert verdict([summary("refusal", candidate_correct=0.5)], noise, Thresholds()) == {
        "refusal": []
    }
    failed = verdict([summary("refusal", candidate_correct=1 / 3)], noise, Thresholds())
    assert failed["refusal"] == ["task score 33% vs baseline 100%"]


def test_exact_match_is_judged_in_categories_but_not_in_long_buckets():
    noise = [summary("format"), summary("long-1k")]
    candidate = [summary("format", exact_match_rate=0.25), summary("long-1k", exact_match_rate=0.0)]
    failures = verdict(candidate, noise, Thresholds())
    assert failures["format"][0].startswith("exact match 25%, 75% below the noise floor")
    assert failures["long-1k"] == []
    strict = verdict(candidate, noise, Thresholds(require_exact=True))
    assert strict["long-1k"] == ["greedy exact match 0%, need 100%"]


def test_needles_sit_at_their_depths_and_the_prompts_share_the_document():
    tokenizer = PromptTokenizer.demo()
    depths = (0.0, 0.5, 1.0)
    prompts = needle_prompts(tokenizer, "1k", 1024, depths)
    assert [p.prompt_id for p in prompts] == ["needle-1k-d00", "needle-1k-d50", "needle-1k-d100"]
    assert all(900 < len(p.token_ids) <= 1024 for p in prompts)
    texts = [tokenizer.decode(list(p.token_ids)) for p in prompts]
    question = texts[0].index("What is the access code")
    assert len({t[:question] for t in texts}) == 1
    document = texts[0][:question]
    places = [document.index(f"is {p.check.expected[0]}.") / len(document) for p in prompts]
    assert places == sorted(places) and places[0] < 0.1 and places[-1] > 0.9
    assert abs(places[1] - 0.5) < 0.1


def test_the_max_length_fills_the_context_and_every_category_is_loaded():
    tokenizer = PromptTokenizer.demo()
    prompts = load_prompt_set(tokenizer, ["1k", "4k", "max"], 2000, per_kind=1)
    kinds = [p.kind for p in prompts]
    assert kinds[: len(CATEGORIES)] == list(CATEGORIES)
    assert kinds.count("long-1k") == 5 and "long-4k" not in kinds
    longest = [p for p in prompts if p.kind == "long-max"]
    assert len(longest) == 5 and all(1900 < len(p.token_ids) <= 2000 for p in longest)
