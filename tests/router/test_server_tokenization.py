"""Router tokenization: prompts, chat rendering, and public-prefix detection."""

from __future__ import annotations

import pytest

from radix.tokenizer import PromptTokenizer
from router.config import ModelConfig, PublicPrefixSpec
from router.errors import ApiError
from router.tokenization import Models, ModelTokenizer, PublicPrefixes

SYSTEM = ({"role": "system", "content": "You are a helpful assistant."},)


def demo_model(*prefixes: PublicPrefixSpec, block_size: int = 4) -> ModelTokenizer:
    config = ModelConfig("demo", "demo", block_size, prefixes)
    return ModelTokenizer(config, PromptTokenizer.demo())


def test_public_prefix_is_longest_registered_rounded_to_blocks() -> None:
    prefixes = PublicPrefixes(block_size=4)
    assert prefixes.add(list(range(10))) == 8
    assert prefixes.add(list(range(6))) == 4
    assert prefixes.num_prefixes == 2
    key = lambda ids: b"".join(i.to_bytes(4, "little") for i in ids)  # noqa: E731
    assert prefixes.num_public_tokens(key(range(20))) == 8      # longest: 10 -> 8
    assert prefixes.num_public_tokens(key([*range(9), 99])) == 4  # only the 6-token one
    assert prefixes.num_public_tokens(key(range(5))) == 0       # no registered prefix fits
    assert prefixes.num_public_tokens(key([7, 8])) == 0
    assert prefixes.add(list(range(10))) == 8 and prefixes.num_prefixes == 2


def test_completion_prompt_text_and_ids() -> None:
    model = demo_model(PublicPrefixSpec(text="Shared document. "))
    prompt = model.completion_prompt("Shared document. And a question?")
    assert prompt.token_ids[0] == model.tokenizer.bos_token_id
    assert prompt.token_ids == model.tokenizer.encode("Shared document. And a question?")
    assert prompt.num_public_tokens == 16     # BOS + 17 bytes = 18 tokens -> 16
    ids = model.completion_prompt([1, 2, 3])
    assert ids.token_ids == [1, 2, 3] and ids.num_public_tokens == 0


@pytest.mark.parametrize("prompt", ["", [], [1, "2"], [10**6], ["a", "b"], None, 5])
def test_bad_completion_prompts(prompt: object) -> None:
    with pytest.raises(ApiError) as info:
        demo_model().completion_prompt(prompt)
    assert info.value.status == 400 and info.value.param == "prompt"


def test_chat_prompt_shares_the_registered_system_message() -> None:
    model = demo_model(PublicPrefixSpec(messages=SYSTEM), block_size=16)
    messages = [*SYSTEM, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    prompt = model.chat_prompt(messages)
    rendered = model.tokenizer.apply_chat_template(
        [*SYSTEM, {"role": "user", "content": "Hi"}])
    assert prompt.token_ids == model.tokenizer.encode(rendered, add_special_tokens=False)
    system_len = len(model.prefix_tokens(PublicPrefixSpec(messages=SYSTEM)))
    assert prompt.num_public_tokens == system_len // 16 * 16 > 0


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ("hi", "messages"),
        ([{"content": "x"}], "messages[0]"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content"),
        ([{"role": "robot", "content": "x"}], "messages"),
    ],
)
def test_bad_messages(messages: object, param: str) -> None:
    with pytest.raises(ApiError) as info:
        demo_model().chat_prompt(messages)
    assert info.value.status == 400 and info.value.param == param


def test_models_lookup() -> None:
    models = Models.from_config({"demo": ModelConfig("demo", "demo")})
    assert models.names() == ["demo"]
    assert models.get("demo").digest == PromptTokenizer.demo().digest
    with pytest.raises(ApiError) as info:
        models.get("gpt-4")
    assert info.value.status == 404 and info.value.code == "model_not_found"
    with pytest.raises(ApiError) as info:
        models.get(3)
    assert info.value.status == 400


def test_bad_tokenizer_source_names_the_model(tmp_path) -> None:
    with pytest.raises(ValueError, match="models.m: .*tokenizer.json: missing"):
        Models.from_config({"m": ModelConfig("m", str(tmp_path))})
    with pytest.raises(ValueError, match="models.m: token_ids must hold"):
        Models.from_config({"m": ModelConfig("m", "demo", 16, (PublicPrefixSpec(
            token_ids=(10**6,)),))})
