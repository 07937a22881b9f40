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
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer

Messages = Sequence[Mapping[str, Any]]
_MARKER_CANDIDATES = (*range(0xE000, 0xF900), *range(0xF0000, 0xFFFFE))


class ChatContentEncoder:
    """Encodes rendered chats of one tokenizer with content kept as text (see the
    module docstring). Thread-safe: it holds no per-call state."""

    def __init__(self, tokenizer: Tokenizer, template_source: str) -> None:
        self._plain = Tokenizer.from_str(tokenizer.to_str())
        self._plain.encode_special_tokens = True
        self._special_ids = {token.content: token_id for token_id, token
                             in tokenizer.get_added_tokens_decoder().items() if token.special}
        by_length = sorted(self._special_ids, key=len, reverse=True)
        self._specials = re.compile("|".join(map(re.escape, by_length))) if by_length else None
        self._template_source = template_source

    def needs_masking(self, messages: Messages) -> bool:
        """True when some message content holds a special-token string."""
        return self._specials is not None and any(
            self._specials.search(message["content"]) for message in messages)

    def encode(self, messages: Messages, render: Callable[[Messages], str]) -> list[int]:
        """Ids of ``render(messages)`` with content special-token strings as text; call
        only when ``needs_masking(messages)`` (else encode the render directly)."""
        assert self._specials is not None
        marker = self._marker(messages)
        names = list(self._special_ids)
        index = {name: i for i, name in enumerate(names)}

        def mask(match: re.Match[str]) -> str:
            return f"{marker}{index[match.group()]}{marker}"

        masked = [{**message, "content": self._specials.sub(mask, message["content"])}
                  for message in messages]
        rendered = render(masked)
        unmask = re.compile(f"{marker}([0-9]+){marker}")
        pieces = self._specials.split(rendered)
        controls = self._specials.findall(rendered)
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
