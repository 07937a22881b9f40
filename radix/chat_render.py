"""Chat prompts rendered once per message: turn ``k + 1`` renders only its new messages.

A conversation comes back every turn with all its earlier messages. For a template
that ``radix.chat_window.WindowTemplate`` accepts (the rendering of a message prefix,
tail aside, is a prefix of every longer conversation's), ``ChatRenderCache`` keeps
each message's piece of the rendering as a link of a hash chain over the messages
(``radix.chain_cache``: the digest of message ``i`` covers messages ``0..i`` and the
tokenizer's digest, which covers the template, its options and the BOS/EOS strings;
Python's own hash of the fields, which strings cache, so hashing a message costs no
pass over its text). A new request finds the longest run of its messages already
rendered (each compared field by field with the one cached, so a digest collision
costs a miss; a field that is not a string by its ``repr``), renders the rest
through the window template (head, the new messages' pieces, tail) and joins.

Checks at use: the window's head must equal the cached first message's head, and
the window must come out as the template's analysis promised; otherwise the caller
renders in full. Content holding special-token strings (``radix.chat_text``) is
rendered in full as well; only the new messages are checked for it, as the cached
ones were checked when they were new. Links are scoped like every prompt cache: a
tenant's rendered messages serve that tenant only, ``PUBLIC`` ones everyone.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jinja2

from radix.chain_cache import ChainCache
from radix.chat_window import WindowTemplate
from radix.tokenizer import PromptTokenizer
from radix.tree import Scope

# Units (4 bytes each) charged per cached message for its objects: the link, its
# key, the fields' tuples, the strings' and the piece's headers.
_MESSAGE_OVERHEAD_UNITS = 128
Fields = tuple[tuple[str, ...], ...]


class _RenderedMessage(NamedTuple):
    """One cached message (its fields) and its piece of the rendering; the first
    message's piece starts with the head, which it also keeps apart for the check at
    use."""

    fields: Fields
    text: str
    head: str | None


class ChatRenderCache:
    """Renders chats of one tokenizer, reusing what each scope rendered before (module
    docstring). Thread-safe: it holds no per-call state outside ``links``."""

    def __init__(self, tokenizer: PromptTokenizer, links: ChainCache[Any]) -> None:
        self._tokenizer = tokenizer
        self._links = links
        source = tokenizer.chat_template
        self._window = WindowTemplate.of(source) if source is not None else None
        self._seed = hash(("chat", tokenizer.digest))
        self._lock = threading.Lock()
        self._num_messages = 0
        self._num_reused_messages = 0

    def stats(self) -> tuple[int, int]:
        """(messages asked for, of those reused already rendered) since start."""
        with self._lock:
            return self._num_messages, self._num_reused_messages

    def render(self, messages: Sequence[Mapping[str, Any]], scope: Scope,
               add_generation_prompt: bool) -> str | None:
        """``tokenizer.apply_chat_template(messages, add_generation_prompt)``; None
        when it must be rendered in full (the template is not incremental, content
        needs masking, a check at use failed). ValueError as ``apply_chat_template``."""
        text = self._render(messages, scope, add_generation_prompt)
        with self._lock:
            self._num_messages += len(messages)
            self._num_reused_messages += text[1] if text is not None else 0
        return text[0] if text is not None else None

    def _render(self, messages: Sequence[Mapping[str, Any]], scope: Scope,
                add_generation_prompt: bool) -> tuple[str, int] | None:
        """(the rendering, how many leading messages were reused), or None."""
        if self._window is None or not messages:
            return None
        fields = [_fields(message) for message in messages]
        digests = _digests(fields, self._seed)
        cached: list[tuple[Any, _RenderedMessage]] = []
        for (key, link), message in zip(self._links.longest(scope, digests), fields,
                                        strict=False):
            if not isinstance(link, _RenderedMessage) or link.fields != message:
                break
            cached.append((key, link))
        start = len(cached)
        if self._tokenizer.chat_needs_masking(messages[start:]):
            return None
        variables = self._tokenizer.chat_variables(messages, add_generation_prompt)
        try:
            window = self._window.render(variables, start)
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template failed: {exc}") from exc
        if window is None or (cached and cached[0][1].head != window.head):
            return None
        new = []
        for i, piece in enumerate(window.pieces, start):
            text = window.head + piece if i == 0 else piece
            link = _RenderedMessage(fields[i], text, window.head if i == 0 else None)
            new.append((digests[i], link, len(text) + _num_chars(fields[i])
                        + _MESSAGE_OVERHEAD_UNITS))
        self._links.extend(scope, [key for key, _ in cached], new)
        text = "".join([*(link.text for _, link in cached), *(link.text for _, link, _ in new),
                        window.tail])
        return text, start


def _fields(message: Mapping[str, Any]) -> Fields:
    """A message as a tuple to hash and compare: its string fields as they are, any
    other as its ``repr`` marked so (``1``, ``1.0`` and ``True`` are equal in Python,
    not in a rendering)."""
    items = tuple(message.items())
    for _, value in items:
        if not isinstance(value, str):
            return tuple((key, value) if isinstance(value, str) else (key, repr(value), "repr")
                         for key, value in items)
    return items


def _digests(fields: Sequence[Fields], seed: int) -> list[int]:
    """The chain digest of each message in turn: Python's hash of the digest before
    and the fields."""
    digests = []
    digest = seed
    for item in fields:
        digest = hash((digest, item))
        digests.append(digest)
    return digests


def _num_chars(fields: Fields) -> int:
    """Characters a message's fields hold."""
    return sum(len(key) + len(value) for key, value, *_ in fields)
