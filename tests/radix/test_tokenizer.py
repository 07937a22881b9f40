"""PromptTokenizer and IncrementalDecoder: round trips, templates, digests, streaming."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix.tokenizer import (
    DEMO_SPECIAL_TOKENS,
    IncrementalDecoder,
    PromptTokenizer,
    demo_tokenizer_files,
)
from tests.support.bpe import merging_bpe
from tests.support.tokenizers import packaged_smollm2

DEMO_DIGEST = "9263baf465f52b68703e73838f6120a24933b45739c3053df979df489f110612"
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "héllo 😀"},
]
# Exercises what real templates use: set, namespace, loop vars, tojson, whitespace control.
RICH_TEMPLATE = """{% set ns = namespace(n=0) %}
{% for message in messages %}
    {% set ns.n = ns.n + 1 %}
    {% if loop.first %}{{ bos_token }}{% endif %}
<|{{ message['role'] }}|>
{{ message['content'] | trim }}{{ ' ' ~ ({'i': ns.n} | tojson) }}<|end|>
{% endfor %}
{% if add_generation_prompt %}<|assistant|>{% endif %}"""


def write_files(path, files=None, **overrides):
    for name, text in {**(files or demo_tokenizer_files()), **overrides}.items():
        (path / name).write_text(text, encoding="utf-8")
    return path


DEMO = PromptTokenizer.demo()
# Special-token strings inside text encode to the special token, as in transformers.
PLAIN_TEXT = st.text().filter(lambda text: "<|" not in text)


@pytest.fixture
def demo():
    return DEMO


def test_byte_ids_and_bos(demo):
    assert demo.encode("A\n") == [demo.bos_token_id, 65, 10]
    assert demo.encode("A", add_special_tokens=False) == [65]
    assert demo.vocab_size == 262
    assert demo.eos_token_ids == (257,)


@settings(max_examples=200, deadline=None)
@given(PLAIN_TEXT)
def test_round_trip_is_exact(text):
    ids = DEMO.encode(text, add_special_tokens=False)
    assert len(ids) == len(text.encode("utf-8"))
    assert DEMO.decode(ids) == text


def test_special_token_text_encodes_to_the_special_token(demo):
    assert demo.encode("a<|user|>", add_special_tokens=False) == [97, 259]


MERGING_BPE = merging_bpe(["the router routes the prompt", "héllo wörld 😀 " * 3])
# Any text, with special-token strings spliced in (they must become special tokens).
TEXT_WITH_SPECIALS = st.lists(st.one_of(st.text(), st.sampled_from(DEMO_SPECIAL_TOKENS))).map(
    "".join
)


@settings(max_examples=300, deadline=None)
@given(TEXT_WITH_SPECIALS, st.booleans())
def test_fast_encode_gives_the_ids_of_the_full_encode(text, add_special_tokens):
    for tokenizer in (DEMO, MERGING_BPE):
        full = tokenizer._tokenizer.encode(text, add_special_tokens=add_special_tokens)
        assert tokenizer.encode(text, add_special_tokens) == full.ids


def test_chat_template_renders_and_encodes_once(demo):
    text = demo.apply_chat_template(MESSAGES)
    assert text == "<|bos|><|system|>Be brief.<|end|><|user|>héllo 😀<|end|><|assistant|>"
    ids = demo.encode_chat(MESSAGES)
    assert ids.count(demo.bos_token_id) == 1 and ids[0] == demo.bos_token_id
    assert ids[-1] == 260  # <|assistant|>
    assert not demo.apply_chat_template(MESSAGES, add_generation_prompt=False).endswith(
        "<|assistant|>"
    )


def test_chat_template_errors_are_value_errors(demo):
    with pytest.raises(ValueError, match="unknown role: tool"):
        demo.apply_chat_template([{"role": "tool", "content": "x"}])


def test_matches_transformers_rendering_and_encoding(tmp_path, demo):
    transformers = pytest.importorskip("transformers")
    config = json.loads(demo_tokenizer_files()["tokenizer_config.json"])
    config["chat_template"] = RICH_TEMPLATE
    write_files(tmp_path, **{"tokenizer_config.json": json.dumps(config)})
    ours = PromptTokenizer.from_dir(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    expected = theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(MESSAGES) == expected
    assert ours.encode("héllo 😀 <|user|>") == theirs("héllo 😀 <|user|>").input_ids


def test_digest_is_stable_and_identical_for_identical_files(tmp_path, demo):
    assert demo.digest == DEMO_DIGEST
    assert PromptTokenizer.from_dir(write_files(tmp_path)).digest == DEMO_DIGEST


def test_digest_covers_template_and_special_tokens(tmp_path):
    config = json.loads(demo_tokenizer_files()["tokenizer_config.json"])
    config["chat_template"] += " "
    changed_template = write_files(tmp_path, **{"tokenizer_config.json": json.dumps(config)})
    assert PromptTokenizer.from_dir(changed_template).digest != DEMO_DIGEST
    extra_eos = tmp_path / "eos"
    extra_eos.mkdir()
    write_files(extra_eos, **{"generation_config.json": '{"eos_token_id": [257, 261]}'})
    tokenizer = PromptTokenizer.from_dir(extra_eos)
    assert tokenizer.eos_token_ids == (257, 261)
    assert tokenizer.digest != DEMO_DIGEST


def test_chat_template_jinja_file_wins(tmp_path):
    write_files(tmp_path, **{"chat_template.jinja": "{{ messages[0]['content'] }}!"})
    assert PromptTokenizer.from_dir(tmp_path).apply_chat_template(MESSAGES) == "Be brief.!"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("tokenizer.json", None, "tokenizer.json: missing tokenizer file"),
        ("tokenizer.json", "{not json", "tokenizer.json: invalid tokenizer"),
        ("tokenizer_config.json", "[1, 2", "tokenizer_config.json: invalid JSON"),
        (
            "tokenizer_config.json",
            '{"eos_token": "<|nope|>"}',
            "tokenizer_config.json: special token",
        ),
        ("generation_config.json", '{"eos_token_id": "x"}', "generation_config.json: eos_token_id"),
        ("chat_template.jinja", "{% for %}", "chat template: invalid jinja"),
    ],
)
def test_bad_files_raise_value_error_naming_the_file(tmp_path, name, content, message):
    write_files(tmp_path)
    if content is None:
        (tmp_path / name).unlink()
    else:
        (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=message.replace("|", r"\|")):
        PromptTokenizer.from_dir(tmp_path)


def test_no_template_raises(tmp_path):
    config = json.loads(demo_tokenizer_files()["tokenizer_config.json"])
    del config["chat_template"]
    tokenizer = PromptTokenizer.from_dir(
        write_files(tmp_path, **{"tokenizer_config.json": json.dumps(config)})
    )
    with pytest.raises(ValueError, match="no chat template"):
        tokenizer.encode_chat(MESSAGES)


def test_incremental_decoder_holds_back_partial_characters(demo):
    decoder = IncrementalDecoder(demo)
    ids = demo.encode("a😀é", add_special_tokens=False)
    assert [decoder.feed([token]) for token in ids] == ["a", "", "", "", "😀", "", "é"]
    assert decoder.flush() == ""


def test_incremental_decoder_flushes_an_unfinished_character(demo):
    decoder = IncrementalDecoder(demo)
    assert decoder.feed(demo.encode("é", add_special_tokens=False)[:1]) == ""
    assert decoder.flush() == "\ufffd"


@settings(max_examples=200, deadline=None)
@given(PLAIN_TEXT, st.lists(st.integers(min_value=1, max_value=5), min_size=1))
def test_incremental_decoder_never_splits_a_character(text, batch_sizes):
    tokenizer = DEMO
    ids = [tokenizer.bos_token_id, *tokenizer.encode(text, add_special_tokens=False)]
    pieces = streamed(IncrementalDecoder(tokenizer), ids, batch_sizes)
    assert "".join(pieces) == text
    if "\ufffd" not in text:
        assert all("\ufffd" not in piece for piece in pieces)


@pytest.mark.slow
def test_radix_tokenizer_does_not_import_torch():
    code = "import sys, radix.tokenizer; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def _byte_level_tokenizers() -> dict[str, PromptTokenizer]:
    found = {"demo": DEMO, "trained-bpe": merging_bpe(["héllo wörld 😀 " * 8, "abc def " * 20])}
    smollm2 = packaged_smollm2()
    if smollm2 is not None:
        found["smollm2"] = smollm2
    return found


BYTE_LEVEL = _byte_level_tokenizers()


def streamed(decoder: IncrementalDecoder, ids: list[int], batch_sizes: list[int]) -> list[str]:
    """What ``decoder`` returns for ``ids`` fed in batches of the sizes in turn, then
    its flush."""
    pieces, start, turn = [], 0, 0
    while start < len(ids):
        size = batch_sizes[turn % len(batch_sizes)]
        pieces.append(decoder.feed(ids[start : start + size]))
        start, turn = start + size, turn + 1
    return [*pieces, decoder.flush()]


@pytest.mark.parametrize("name", sorted(BYTE_LEVEL))
def test_byte_level_tokenizers_have_a_piece_per_id(name):
    tokenizer = BYTE_LEVEL[name]
    pieces = tokenizer.byte_pieces
    assert pieces is not None and len(pieces) == tokenizer.vocab_size
    for token_id in range(0, tokenizer.vocab_size, max(tokenizer.vocab_size // 500, 1)):
        text = pieces[token_id].decode("utf-8", "replace")
        assert text == tokenizer.decode([token_id]), token_id


@settings(max_examples=300, deadline=None)
@given(st.data(), st.lists(st.integers(min_value=1, max_value=4), min_size=1))
def test_the_byte_level_decoder_streams_exactly_what_decode_returns(data, batch_sizes):
    """Any ids (special tokens, bytes that are no valid UTF-8, ids past the vocabulary)
    fed in any batches: the pieces joined equal one ``decode`` of all of them, and a
    text decoded without U+FFFD is streamed without one."""
    tokenizer = BYTE_LEVEL[data.draw(st.sampled_from(sorted(BYTE_LEVEL)))]
    ids = data.draw(st.lists(st.integers(0, tokenizer.vocab_size + 3), max_size=40))
    pieces = streamed(IncrementalDecoder(tokenizer), ids, batch_sizes)
    expected = tokenizer.decode([i for i in ids if i < tokenizer.vocab_size])
    assert "".join(pieces) == expected
    if "\ufffd" not in expected:
        assert all("\ufffd" not in piece for piece in pieces)


def test_a_tokenizer_that_is_not_byte_level_decodes_through_windows(tmp_path):
    spec = json.loads(demo_tokenizer_files()["tokenizer.json"])
    spec["decoder"] = {"type": "Fuse"}
    tokenizer = PromptTokenizer(json.dumps(spec), None, "<|bos|>", "<|eos|>")
    assert tokenizer.byte_pieces is None
    decoder = IncrementalDecoder(tokenizer)
    ids = tokenizer.encode("ab", add_special_tokens=False)
    assert "".join(decoder.feed([i]) for i in ids) + decoder.flush() == tokenizer.decode(ids)
