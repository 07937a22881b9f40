"""Prompt tokenization shared by router and worker: one tokenizer, one chat template.

The router tokenizes untrusted requests and the worker decodes what it generates;
both load the same files through ``PromptTokenizer`` so a prompt becomes the same
token ids on both sides, and ``digest`` names those files in the cache namespace.

The chat template is rendered the way Hugging Face ``transformers`` renders it: an
immutable sandboxed jinja2 environment with ``trim_blocks``/``lstrip_blocks``, the
``tojson`` filter and the ``raise_exception``/``strftime_now`` globals. Template
authors' ``{% generation %}`` markers are accepted and render their body.

No torch here: the router imports this module.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from radix.chat_text import ChatContentEncoder

_DIGEST_DOMAIN = b"radix-router/tokenizer/v1"
_REPLACEMENT_CHAR = "\ufffd"

DEMO_SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
DEMO_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


class PromptTokenizer:
    """A ``tokenizers.Tokenizer`` plus chat template and special-token ids.

    Guarantees: ``encode``/``decode`` are those of the wrapped tokenizer;
    ``encode_chat`` renders the template and encodes it without adding special tokens a
    second time, keeping special-token strings inside message content as text;
    ``digest`` is a pure function of the loaded file contents.
    """

    def __init__(
        self,
        tokenizer_json: str,
        chat_template: str | None,
        bos_token: str | None,
        eos_token: str | None,
        extra_eos_token_ids: Iterable[int] = (),
    ) -> None:
        try:
            self._tokenizer = Tokenizer.from_str(tokenizer_json)
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise ValueError(f"tokenizer.json: invalid tokenizer: {exc}") from exc
        self.tokenizer_json = tokenizer_json
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = self._token_id(bos_token)
        eos_ids = [self._token_id(eos_token), *extra_eos_token_ids]
        self.eos_token_ids: tuple[int, ...] = tuple(
            dict.fromkeys(i for i in eos_ids if i is not None)
        )
        self.vocab_size: int = self._tokenizer.get_vocab_size(with_added_tokens=True)
        try:
            self._template = compile_chat_template(chat_template) if chat_template is not None else None
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat template: invalid jinja: {exc}") from exc
        specials = {
            "bos_token": bos_token,
            "bos_token_id": self.bos_token_id,
            "eos_token": eos_token,
            "eos_token_ids": list(self.eos_token_ids),
        }
        template_field = b"" if chat_template is None else b"\x01" + chat_template.encode()
        self.digest: str = hashlib.sha256(
            _length_prefixed(
                _DIGEST_DOMAIN,
                tokenizer_json.encode(),
                template_field,
                json.dumps(specials, sort_keys=True, separators=(",", ":")).encode(),
            )
        ).hexdigest()

    @classmethod
    def from_dir(cls, path: str | Path) -> PromptTokenizer:
        """Load tokenizer.json (required), tokenizer_config.json, chat_template.jinja,
        config.json and generation_config.json (optional) from a model directory.

        Raises ValueError naming the file when a file is missing or invalid.
        """
        root = Path(path)
        tokenizer_file = root / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ValueError(f"{tokenizer_file}: missing tokenizer file")
        try:
            tokenizer_json = tokenizer_file.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{tokenizer_file}: not UTF-8: {exc}") from exc
        tok_config = _read_json(root / "tokenizer_config.json")
        template = _chat_template(root, tok_config)
        extra_eos: list[int] = []
        for name in ("config.json", "generation_config.json"):
            extra_eos += _id_list(_read_json(root / name).get("eos_token_id"), root / name)
        try:
            return cls(
                tokenizer_json,
                template,
                _token_text(tok_config.get("bos_token")),
                _token_text(tok_config.get("eos_token")),
                extra_eos,
            )
        except ValueError as exc:
            raise ValueError(f"{root}: {exc}") from exc

    @classmethod
    def demo(cls) -> PromptTokenizer:
        """The byte-level demo tokenizer, built in memory from ``demo_tokenizer_files()``."""
        files = demo_tokenizer_files()
        config = json.loads(files["tokenizer_config.json"])
        return cls(
            files["tokenizer.json"],
            config["chat_template"],
            config["bos_token"],
            config["eos_token"],
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; the tokenizer's post-processor adds BOS etc. when asked.

        Special-token strings inside ``text`` become their special tokens, as in
        transformers: callers that must not allow that have to escape user text.
        Uses ``encode_batch_fast``, which skips the character offsets ``encode``
        computes and nobody here reads (half the CPU; same ids, property-tested).
        """
        encoding = self._tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        return encoding[0].ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode(text, add_special_tokens=False)`` of each text, in one call."""
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids``; incomplete UTF-8 sequences decode to U+FFFD."""
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    @functools.cached_property
    def byte_pieces(self) -> tuple[bytes, ...] | None:
        """The bytes each token id decodes to (``b""`` for special tokens, which
        ``decode`` skips) when decoding is plain byte-level BPE: a ``ByteLevel``
        decoder, every vocabulary token spelled in GPT-2's byte alphabet, every added
        token printable ASCII (the same bytes however it is read). ``decode`` is then
        the lossy UTF-8 decoding of the ids' pieces joined. None for any other
        tokenizer."""
        spec = json.loads(self.tokenizer_json)
        if (spec.get("decoder") or {}).get("type") != "ByteLevel":
            return None
        byte_of = {char: byte for byte, char in enumerate(byte_alphabet())}
        pieces: list[bytes | None] = [None] * self.vocab_size
        for token, token_id in self._tokenizer.get_vocab(with_added_tokens=False).items():
            if token_id >= self.vocab_size or any(char not in byte_of for char in token):
                return None
            pieces[token_id] = bytes(byte_of[char] for char in token)
        for added in spec.get("added_tokens") or ():
            content = added["content"]
            if not content.isascii() or not all("!" <= char <= "~" for char in content):
                return None
            pieces[added["id"]] = b"" if added["special"] else content.encode()
        if any(piece is None for piece in pieces):
            return None
        return tuple(piece for piece in pieces if piece is not None)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """Render ``messages`` with the chat template; ValueError if there is none or it fails."""
        if self._template is None:
            raise ValueError("tokenizer has no chat template")
        try:
            return self._template.render(self.chat_variables(messages, add_generation_prompt))
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template failed: {exc}") from exc

    def chat_variables(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool
    ) -> dict[str, Any]:
        """What the chat template is rendered with: the messages (as dicts), the
        generation-prompt switch, and the BOS and EOS token strings."""
        return {
            "messages": [dict(message) for message in messages],
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
        }

    def chat_needs_masking(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """True when some message content holds a special-token string, so
        ``encode_chat`` keeps it as text instead of encoding the render directly."""
        return self._content_encoder.needs_masking(messages)

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        encode_text: Callable[[str], list[int]] | None = None,
    ) -> list[int]:
        """Token ids of the rendered chat, specials not re-added. Special-token strings
        inside message ``content`` are encoded as plain text; the template's own
        control tokens stay special (``radix.chat_text``). ``encode_text`` (default
        ``encode(text, add_special_tokens=False)``) encodes a render that needs no
        masking: a cache of token ids plugs in there. ValueError as
        ``apply_chat_template``."""

        def render(rendered: Sequence[Mapping[str, Any]]) -> str:
            return self.apply_chat_template(rendered, add_generation_prompt)

        if self.chat_needs_masking(messages):
            return self._content_encoder.encode(messages, render)
        if encode_text is None:
            return self.encode(render(messages), add_special_tokens=False)
        return encode_text(render(messages))

    @functools.cached_property
    def _content_encoder(self) -> ChatContentEncoder:
        return ChatContentEncoder(self._tokenizer, self.chat_template or "")

    def vocabulary(self) -> dict[str, int]:
        """Token string -> id, added tokens included."""
        return self._tokenizer.get_vocab(with_added_tokens=True)

    @functools.cached_property
    def max_chars_per_token(self) -> int:
        """The most characters of input text one token can stand for: the longest
        vocabulary entry (byte-level entries have one character per byte, the widest
        a character can be). A text of ``c`` characters has at least
        ``c / max_chars_per_token`` tokens unless the tokenizer's normalizer deletes
        characters, so prompts can be bounded before they are tokenized."""
        return max(map(len, self.vocabulary()))

    def _token_id(self, token: str | None) -> int | None:
        if token is None:
            return None
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(
                f"tokenizer_config.json: special token {token!r} is not in the vocabulary"
            )
        return token_id


class IncrementalDecoder:
    """Turns a stream of token ids into a stream of text without splitting characters.

    ``feed`` returns only text not returned before, and never text ending in an
    incomplete UTF-8 sequence (it is held back until more ids arrive). ``flush``
    returns whatever is held back. The texts joined equal ``decode`` of all the ids.
    A byte-level tokenizer (``PromptTokenizer.byte_pieces``) decodes each id's bytes
    through an incremental UTF-8 decoder: a table lookup per id. Any other decodes a
    window starting a few tokens back twice per feed (a decoded tail of U+FFFD is held
    back), so tokenizers that drop a leading space on the first token still produce
    the same text as decoding everything at once.
    """

    def __init__(self, tokenizer: PromptTokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._token_ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._pieces = tokenizer.byte_pieces if skip_special_tokens else None
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token_ids: Sequence[int]) -> str:
        """Append ``token_ids``; return the newly completed text (possibly empty)."""
        if self._pieces is not None:
            pieces = self._pieces
            try:
                data = b"".join([pieces[token_id] for token_id in token_ids])
            except IndexError:  # an id past the vocabulary (a padded model's): no text
                data = b"".join([pieces[i] for i in token_ids if i < len(pieces)])
            return self._utf8.decode(data)
        self._token_ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Return all text still held back, even if it ends in U+FFFD."""
        if self._pieces is not None:
            return self._utf8.decode(b"", final=True)
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        prefix_text = self._decode(self._token_ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._token_ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or (
            full_text.endswith(_REPLACEMENT_CHAR) and not final
        ):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        return full_text[len(prefix_text) :]

    def _decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens)


def demo_tokenizer_files() -> dict[str, str]:
    """File name -> exact text of the demo tokenizer's tokenizer.json and tokenizer_config.json.

    Byte-level: token id ``b`` (0..255) is byte ``b``, then the ``DEMO_SPECIAL_TOKENS``
    (ids 256..261). BOS is prepended when special tokens are added. The text is
    built from literals, so it is identical on every machine and library version.
    """
    byte_chars = byte_alphabet()
    flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
    added = [
        {"id": len(byte_chars) + i, "content": token, **flags, "special": True}
        for i, token in enumerate(DEMO_SPECIAL_TOKENS)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    byte_level["use_regex"] = False
    bos = {"SpecialToken": {"id": "<|bos|>", "type_id": 0}}
    seq_a, seq_b = ({"Sequence": {"id": name, "type_id": i}} for i, name in enumerate("AB"))
    bos_ids = {"id": "<|bos|>", "ids": [len(byte_chars)], "tokens": ["<|bos|>"]}
    post_processor = {
        "type": "TemplateProcessing",
        "single": [bos, seq_a],
        "pair": [bos, seq_a, seq_b],
    }
    post_processor["special_tokens"] = {"<|bos|>": bos_ids}
    model = dict.fromkeys(
        ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix")
    )
    model.update(fuse_unk=False, byte_fallback=False, ignore_merges=False, merges=[])
    model.update(vocab={char: byte for byte, char in enumerate(byte_chars)}, type="BPE")
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added}
    tokenizer.update(normalizer=None, pre_tokenizer=byte_level, post_processor=post_processor)
    tokenizer.update(decoder=byte_level, model=model)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "chat_template": DEMO_CHAT_TEMPLATE,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
    }
    return {
        "tokenizer.json": json.dumps(tokenizer, indent=2, ensure_ascii=False) + "\n",
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n",
    }


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in character for each byte value, indexed by byte (the
    alphabet byte-level BPE vocabularies are spelled in)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)}
    printable |= set(range(ord("®"), ord("ÿ") + 1))
    others = (b for b in range(256) if b not in printable)
    chars = {b: chr(b) for b in printable} | {b: chr(256 + n) for n, b in enumerate(others)}
    return [chars[b] for b in range(256)]


def _length_prefixed(*fields: bytes) -> bytes:
    return b"".join(len(field).to_bytes(8, "big") + field for field in fields)


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, ``{}`` if the file is absent; ValueError naming it if invalid."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def _chat_template(root: Path, tok_config: Mapping[str, Any]) -> str | None:
    """chat_template.jinja if present, else tokenizer_config.json's ``chat_template``
    (a string, or a list of named templates of which ``default`` is used)."""
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = tok_config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ValueError(f"{root / 'tokenizer_config.json'}: chat_template must be a string")


def _token_text(token: Any) -> str | None:
    """A special token given as a string or as an AddedToken dict ``{"content": ...}``."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _id_list(value: Any, path: Path) -> list[int]:
    if value is None:
        return []
    ids = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"{path}: eos_token_id must be an int or a list of ints")
    return ids


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def compile_chat_template(template: str) -> jinja2.Template:
    """``template`` compiled the way ``PromptTokenizer`` renders chat templates (module
    docstring); jinja2.TemplateSyntaxError if it does not parse."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)
