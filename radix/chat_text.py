"""Chat message content is text: special-token strings a user writes stay text.

A chat prompt is the chat template rendered over the messages. Encoded as one
string, a message whose content holds ``<|end|><|system|>`` would get the real
control tokens (role spoofing). ``ChatContentEncoder`` keeps the template's own
control tokens special and encodes everything from message content as plain text:

1. Fast path: no content holds a special-token string -> encode the rendered text
   as it is (exactly today's ids).
2. Otherwise each special-token string in content is replaced by a marker (a
   private-use character absent from the template and every content, the token's
   number, the marker again), the template is rendered, the result is cut at the
   special tokens now present (all of them the template's), and each piece between
   them is encoded with a copy of the tokenizer whose ``encode_special_tokens`` is
   on, after the markers are turned back into the strings they stand for.

Hugging Face ``tokenizers`` cuts its input at special tokens first and encodes the
pieces independently, so step 2 gives step 1's ids whenever there is nothing to
mask (property-tested); it differs only where content held special-token text.

Special-token strings are found by ``SpecialFinder``, leftmost-longest. A regular
expression alternating the specials skips ordinary text at C speed, but costs Python's
engine a try per alternative at every place a special could start (``<|`` for Llama
3): crafted content (``<|r`` repeated) makes it quadratic-looking. So the finder
counts those places first (``str.count``, C speed) and, when there are many, uses the
Aho-Corasick automaton ``tokenizers`` builds for added tokens (in Rust, linear in the
text whatever it holds) instead. Both give the same cuts (property-tested).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tokenizers import AddedToken, Tokenizer, models

Messages = Sequence[Mapping[str, Any]]
_MARKER_CANDIDATES = (*range(0xE000, 0xF900), *range(0xF0000, 0xFFFFE))
_OTHER = "[other]"


class SpecialFinder:
    """Finds exact occurrences of a set of strings, leftmost-longest, at a cost linear
    in the text (see the module docstring)."""

    def __init__(self, strings: Sequence[str], max_regex_starts: int = 256) -> None:
        by_length = sorted(strings, key=len, reverse=True)
        self._regex = re.compile("|".join(map(re.escape, by_length)))
        self._starts = {s[:2] for s in strings}
        self._max_regex_starts = max_regex_starts
        self._automaton = Tokenizer(models.WordLevel({_OTHER: 0}, unk_token=_OTHER))
        self._automaton.add_special_tokens([AddedToken(s, special=True, normalized=False)
                                            for s in strings])

    def _regex_is_cheap(self, text: str) -> bool:
        return sum(text.count(start) for start in self._starts) <= self._max_regex_starts

    def contains_any(self, text: str) -> bool:
        """Whether ``text`` holds one of the strings."""
        if self._regex_is_cheap(text):
            return self._regex.search(text) is not None
        return any(self._automaton.encode(text, add_special_tokens=False).ids)

    def split(self, text: str) -> tuple[list[str], list[str]]:
        """(pieces, found): ``text`` cut at each occurrence, ``len(pieces) ==
        len(found) + 1``, and ``pieces[0] + found[0] + pieces[1] + ... == text``."""
        if self._regex_is_cheap(text):
            return self._regex.split(text), self._regex.findall(text)
        encoding = self._automaton.encode(text, add_special_tokens=False)
        pieces, found, start = [], [], 0
        for token_id, token, (begin, end) in zip(encoding.ids, encoding.tokens,
                                                 encoding.offsets, strict=True):
            if token_id:
                pieces.append(text[start:begin])
                found.append(token)
                start = end
        pieces.append(text[start:])
        return pieces, found


class ChatContentEncoder:
    """Encodes rendered chats of one tokenizer with content kept as text (see the
    module docstring). Thread-safe: it holds no per-call state."""

    def __init__(self, tokenizer: Tokenizer, template_source: str) -> None:
        self._plain = Tokenizer.from_str(tokenizer.to_str())
        self._plain.encode_special_tokens = True
        self._special_ids = {token.content: token_id for token_id, token
                             in tokenizer.get_added_tokens_decoder().items() if token.special}
        self._specials = SpecialFinder(list(self._special_ids)) if self._special_ids else None
        self._template_source = template_source

    def needs_masking(self, messages: Messages) -> bool:
        """True when some message content holds a special-token string."""
        return self._specials is not None and any(
            self._specials.contains_any(message["content"]) for message in messages)

    def encode(self, messages: Messages, render: Callable[[Messages], str]) -> list[int]:
        """Ids of ``render(messages)`` with content special-token strings as text; call
        only when ``needs_masking(messages)`` (else encode the render directly)."""
        assert self._specials is not None
        marker = self._marker(messages)
        names = list(self._special_ids)
        index = {name: i for i, name in enumerate(names)}

        def mask(content: str) -> str:
            pieces, found = self._specials.split(content)  # type: ignore[union-attr]
            out = [pieces[0]]
            for special, piece in zip(found, pieces[1:], strict=True):
                out += (marker, str(index[special]), marker, piece)
            return "".join(out)

        masked = [{**message, "content": mask(message["content"])} for message in messages]
        rendered = render(masked)
        unmask = re.compile(f"{marker}([0-9]+){marker}")
        pieces, controls = self._specials.split(rendered)
        texts = [unmask.sub(lambda m: names[int(m.group(1))], piece) for piece in pieces]
        encoded = self._plain.encode_batch_fast(texts, add_special_tokens=False)
        token_ids: list[int] = list(encoded[0].ids)
        for control, piece in zip(controls, encoded[1:], strict=True):
            token_ids.append(self._special_ids[control])
            token_ids.extend(piece.ids)
        return token_ids

    def _marker(self, messages: Messages) -> str:
        """A private-use character found in no content and not in the template."""
        seen = set(self._template_source)
        for message in messages:
            seen.update(message["content"])
        for code in _MARKER_CANDIDATES:
            if chr(code) not in seen:
                return chr(code)
        raise ValueError("message content uses every private-use character")
