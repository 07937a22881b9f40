"""An ``openai``-kind backend's completions stream, passed through to the client.

The backend's SSE bytes go to the client as they came, one write per network read,
with two exceptions: every chunk names the router's model (``ModelRenamer``), and a
usage-only chunk the client did not ask for (the router always asks for usage) is
left out with the blank line after it. Only the chunks that can tell the router
something are parsed: the usage chunk (completion and cached tokens) and anything
that is not a plain token chunk (an error event). A plain token chunk is a ``data:
{`` line with ``"choices"`` and no ``"usage"`` key, or with a non-empty
``"choices":[{`` and ``"usage":null`` (SGLang sends a null usage on every chunk):
an unescaped quote can only delimit a key or a value, since a quote inside a JSON
string is escaped, so these tests on the bytes are exact. Each plain chunk counts as
one completion token until the usage chunk gives the real count (a stream cut before
it is charged what it delivered).
"""

from __future__ import annotations

import orjson

from radix.openai.responses import DONE_FRAME
from router.forward.masking import ModelRenamer
from router.forward.relay import Exchange, note_usage

_DATA_OBJECT = b"data: {"
_DONE_LINE = b"data: [DONE]"
_USAGE_KEY = b'"usage"'
_CHOICES_KEY = b'"choices"'
_NULL_USAGE = (b'"usage":null', b'"usage": null')
_SOME_CHOICES = (b'"choices":[{', b'"choices": [{')


class CompletionPassthrough:
    """One stream's state across its network reads: the renamer, whether the client
    wants the usage chunk, and whether the next line is the blank line of a dropped
    one."""

    def __init__(self, ours: str, backend: str | None, include_usage: bool) -> None:
        self._rename = ModelRenamer(ours, backend)
        self._include_usage = include_usage
        self._skip_line = False

    def feed(self, lines: list[bytes], out: list[bytes], exchange: Exchange) -> bool:
        """Append to ``out`` what the client gets of ``lines`` (one read's complete
        lines, without their ``\\n``), noting tokens and usage in ``exchange``; True at
        ``[DONE]`` (``out`` then ends with it, and the rest is ignored). ``ValueError``
        on the backend's error event or a malformed chunk: ``out`` holds what came
        before it."""
        for line in lines:
            if self._skip_line:
                self._skip_line = False
                continue
            if line.startswith(_DATA_OBJECT):
                line = self._rename(line)
                if _plain_token_chunk(line):
                    exchange.num_completion_tokens += 1  # a chunk is about one token
                elif not self._usage_kept(line, exchange):
                    self._skip_line = True
                    continue
            elif line.rstrip() == _DONE_LINE:
                out.append(DONE_FRAME)
                return True
            out.append(line + b"\n")
        return False

    def _usage_kept(self, line: bytes, exchange: Exchange) -> bool:
        """Read a chunk that is not a plain token chunk: note its usage; False when it
        is a usage-only chunk the client did not ask for."""
        chunk = orjson.loads(line[len(_DATA_OBJECT) - 1:])
        if "error" in chunk or chunk.get("object") == "error":
            raise ValueError(f"error event {chunk}")
        note_usage(exchange, chunk.get("usage"))
        return bool(chunk.get("choices")) or self._include_usage


def _plain_token_chunk(line: bytes) -> bool:
    """Choices and no usage key, or some choices and a null usage (module docstring)."""
    if _USAGE_KEY not in line:
        return _CHOICES_KEY in line
    return (any(marker in line for marker in _NULL_USAGE)
            and any(marker in line for marker in _SOME_CHOICES))
