"""The tokenize-stage benchmark measures every scenario through ModelTokenizer.prompt,
and its turn-10 chats are new conversations whose turns 1-9 come first."""

from bench import tokenize_stage
from bench.overhead_load import CHAT_TURNS, chat_turn10, prompts


def test_a_small_run_measures_every_scenario():
    results = tokenize_stage.main(["--requests", "40", "--repetitions", "2",
                                   "--tokenizer", "demo"])
    assert set(results["median"]) == set(tokenize_stage.SCENARIOS)
    assert len(results["runs"]) == 2
    assert all(median > 0 and mean > 0 for median, mean in results["median"].values())


def test_turn_ten_comes_after_its_own_turns_and_no_other_chat():
    warmup, measured = chat_turn10(100)
    assert len(measured) == 10 and len(warmup) == 9 * 10
    assert all(len(turn) == 2 * CHAT_TURNS for turn in measured)
    for turn10 in measured:
        turn9 = next(turn for turn in warmup if len(turn) == 2 * CHAT_TURNS - 2
                     and turn[0] == turn10[0])
        assert turn10[: len(turn9)] == turn9
    seen = {turn[0]["content"] for turn in prompts(100, "chat")}
    assert not seen & {turn[0]["content"] for turn in measured}
