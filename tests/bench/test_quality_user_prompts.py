"""The quality gate's user prompt file (``--prompts``): each malformed line is refused
with its line number, before any model is loaded; a good file gives each prompt its
bucket, id and check."""

from __future__ import annotations

import hashlib
import json

import pytest

from bench.quality.__main__ import main
from bench.quality.checks import Check
from bench.quality.user_prompts import PromptFileError, read_user_prompts
from radix.tokenizer import PromptTokenizer

GOOD = json.dumps({"prompt": "The capital of France is", "expected": "Paris"})
CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        (json.dumps({"prompt": "a", "messages": CHAT}), 'exactly one of "prompt" and "messages"'),
        (json.dumps({"expected": "x"}), 'exactly one of "prompt" and "messages"'),
        (json.dumps({"prompt": " "}), '"prompt" must be a non-empty string'),
        (json.dumps({"prompt": 7}), '"prompt" must be a non-empty string'),
        (json.dumps({"messages": []}), '"messages" must be a non-empty list'),
        (json.dumps({"messages": [{"role": "robot", "content": "hi"}]}), "messages[0] must be"),
        (json.dumps({"messages": [{"role": "user"}]}), "messages[0] must be"),
        (json.dumps({"prompt": "a", "expected": 3}), '"expected" must be a non-empty string'),
        (json.dumps({"prompt": "a", "expected": []}), '"expected" must be a non-empty string'),
        (json.dumps({"prompt": "a", "bucket": "tool_call"}), "one of the gate's own buckets"),
        (json.dumps({"prompt": "a", "bucket": "long-1k"}), "one of the gate's own buckets"),
        (json.dumps({"prompt": "a", "bucket": ""}), '"bucket" must be a non-empty string'),
        (json.dumps({"prompt": "a", "colour": "red"}), "unknown field 'colour'"),
        (json.dumps({"prompt": "a", "id": "1"}), "id '1' is taken by line 1"),
    ],
)
def test_a_malformed_line_is_refused_with_its_line_number(tmp_path, line, says):
    path = tmp_path / "prompts.jsonl"
    path.write_text(f"{GOOD}\n\n{line}\n{GOOD}\n")  # the bad line is line 3
    with pytest.raises(PromptFileError) as refused:
        read_user_prompts(path)
    assert str(refused.value).startswith(f"{path} line 3: ")
    assert says in str(refused.value)


@pytest.mark.parametrize("text", ["", "\n  \n", b"\xff\xfe"])
def test_a_file_without_a_prompt_or_not_utf8_is_refused(tmp_path, text):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(PromptFileError, match=str(path)):
        read_user_prompts(path)


def test_each_line_gets_its_bucket_id_and_check_and_the_file_its_sha256(tmp_path):
    lines = [GOOD, "",
             json.dumps({"messages": CHAT, "bucket": "support", "id": "greet",
                         "expected": ["Hello", "Hi"]}),
             json.dumps({"messages": CHAT, "bucket": "support"})]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    read = read_user_prompts(path)
    assert read.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert [(p.line, p.prompt_id, p.bucket) for p in read.prompts] == [
        (1, "1", "user"), (3, "greet", "support"), (4, "4", "support")]
    assert [p.check for p in read.prompts] == [
        Check("contains", ("Paris",)), Check("contains", ("Hello", "Hi")), None]
    prompts = read.quality_prompts(PromptTokenizer.demo(), 4096)
    assert [(p.prompt_id, p.kind) for p in prompts] == [
        ("prompts.jsonl:1", "user"), ("prompts.jsonl:greet", "support"),
        ("prompts.jsonl:4", "support")]
    assert prompts[1].token_ids == prompts[2].token_ids  # the same chat, the same tokens


def test_a_prompt_longer_than_the_context_allows_is_refused_with_its_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(f"{GOOD}\n{json.dumps({'prompt': 'word ' * 50})}\n")
    read = read_user_prompts(path)
    tokenizer = PromptTokenizer.demo()
    first = len(read.quality_prompts(tokenizer, 4096)[0].token_ids)
    with pytest.raises(PromptFileError, match=rf"{path} line 2: \d+ tokens; .* 1 to {first}"):
        read.quality_prompts(tokenizer, first)


def test_the_command_refuses_a_malformed_file_before_loading_a_model(tmp_path, capsys):
    config = tmp_path / "kv.toml"
    config.write_text('[model]\nname = "no-such-model"\n')
    path = tmp_path / "prompts.jsonl"
    path.write_text(f"{GOOD}\n{{\"prompt\": \"a\", \"expected\": 3}}\n")
    with pytest.raises(SystemExit) as exited:
        main(["--baseline", str(config), "--candidate", str(config), "--prompts", str(path)])
    assert exited.value.code == 2
    assert f"--prompts: {path} line 2: \"expected\"" in capsys.readouterr().err
