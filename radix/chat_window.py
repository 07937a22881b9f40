"""Chat templates that can render only a conversation's new messages.

A chat template rendered over ``messages[:n]`` usually reads as a head, one piece per
message, and a tail (the generation prompt). When the piece of message ``i`` depends
only on messages ``0..i`` and the head and tail on neither the count nor the last
message, the rendering of ``messages[:k]`` without its tail is a prefix of the
rendering of every longer conversation starting with them, and turn ``k + 1`` needs
only the pieces of the messages after ``k``. ``WindowTemplate.of`` decides this per
template from its syntax tree, and accepts only templates shaped as:

- a **head**: statements before one top-level ``{% for X in messages %}`` (no filter,
  no ``else``, not recursive), reading ``messages`` only as ``messages[0]`` and never
  ``add_generation_prompt``;
- the **loop body**: reads ``X``, ``messages[0]``, ``loop.index``, ``loop.index0`` and
  ``loop.first`` (never ``loop.last``, ``loop.length``, ``messages|length`` or other
  messages, which change as the conversation grows), sets only its own variables, may
  ``continue`` but not ``break``, holds no nested loop;
- a **tail**: the statements after the loop, reading neither ``messages`` nor ``loop``.

Anywhere: only output, ``if``, ``set`` of plain names, the ``{% generation %}`` tag
and expressions; calls only to ``raise_exception``, ``range``, ``dict`` and methods
(the immutable sandbox refuses mutating ones); nothing that differs between two
renders (``strftime_now``, ``random``, ``lipsum``, ``cycler``, ``joiner``,
``namespace``). Any other template renders in full every time.

The window template is the same tree with the loop over ``messages[start:]``, its
``loop.index``/``index0`` shifted by ``start`` and ``loop.first`` true only when
``start`` is 0, and three marker outputs (after the head, before each message's
piece, after the loop). The markers are private string objects told apart by
identity, so no message content can forge one. ``render`` checks the markers came
out as promised (one head, one piece per message from ``start``, one tail) and
returns None otherwise, so the caller falls back to a full render.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.visitor import NodeTransformer

from radix.tokenizer import compile_chat_template

_START = "rr_window_start"
_MARKS = {name: "".join(["\uf8ff", name]) for name in ("rr_head_end", "rr_item", "rr_loop_end")}
_HEAD_END, _ITEM, _LOOP_END = _MARKS.values()
_RESERVED = frozenset({_START, *_MARKS, "strftime_now", "lipsum", "cycler", "joiner",
                       "namespace", "loop", "messages"})
_CALLABLE = frozenset({"raise_exception", "range", "dict"})
_LOOP_ATTRS = frozenset({"index", "index0", "first"})
_NODES = (nodes.Output, nodes.TemplateData, nodes.If, nodes.Scope, nodes.Const, nodes.Name,
          nodes.Getattr, nodes.Getitem, nodes.Slice, nodes.Filter, nodes.Test, nodes.CondExpr,
          nodes.Concat, nodes.Compare, nodes.Operand, nodes.And, nodes.Or, nodes.Not,
          nodes.Neg, nodes.Pos, nodes.BinExpr, nodes.List, nodes.Tuple, nodes.Dict,
          nodes.Pair, nodes.Keyword)


@dataclass(frozen=True)
class Window:
    """A rendering cut at the markers: the head, one piece per message from ``start``,
    and the tail; ``head + "".join(pieces) + tail`` is the full rendering."""

    head: str
    pieces: list[str]
    tail: str


class WindowTemplate:
    """A chat template that renders any window of messages (module docstring)."""

    def __init__(self, template: jinja2.Template) -> None:
        self._template = template

    @classmethod
    def of(cls, source: str) -> WindowTemplate | None:
        """The window template of ``source``, or None when its shape is not one the
        module docstring accepts (or it does not parse). Built once per source (a
        compiled template is read-only)."""
        return _window_of(source)

    def render(self, variables: Mapping[str, Any], start: int) -> Window | None:
        """The rendering of ``variables`` (the template's, ``messages`` among them) cut
        into head, the pieces of ``messages[start:]`` and tail; None if the markers
        did not come out as promised. Template errors propagate as jinja raises them."""
        head: list[str] = []
        pieces: list[list[str]] = []
        tail: list[str] = []
        out: list[str] | None = head
        num_head_ends = num_loop_ends = 0
        for text in self._template.generate(**variables, **_MARKS, **{_START: start}):
            if text is _HEAD_END:
                num_head_ends += 1
                out = None
            elif text is _ITEM:
                pieces.append([])
                out = pieces[-1]
            elif text is _LOOP_END:
                num_loop_ends += 1
                out = tail
            elif out is not None:
                out.append(text)
        if num_head_ends != 1 or num_loop_ends != 1 or (
                len(pieces) != max(len(variables["messages"]) - start, 0)):
            return None
        return Window("".join(head), ["".join(p) for p in pieces], "".join(tail))


@functools.lru_cache(maxsize=16)
def _window_of(source: str) -> WindowTemplate | None:
    """``WindowTemplate.of``, uncached."""
    try:
        env = compile_chat_template(source).environment
        tree = env.parse(source)
    except jinja2.TemplateSyntaxError:
        return None
    loops = [i for i, node in enumerate(tree.body) if isinstance(node, nodes.For)]
    if len(loops) != 1:
        return None
    at = loops[0]
    head, loop, tail = tree.body[:at], tree.body[at], tree.body[at + 1:]
    if not (isinstance(loop.target, nodes.Name) and isinstance(loop.iter, nodes.Name)
            and loop.iter.name == "messages" and loop.test is None and not loop.else_
            and not loop.recursive):
        return None
    target = loop.target.name
    if target in _RESERVED or not (
            all(_allowed(node, "head", target) for node in head)
            and all(_allowed(node, "body", target) for node in loop.body)
            and all(_allowed(node, "tail", target) for node in tail)):
        return None
    return WindowTemplate(env.from_string(_window_tree(env, head, loop, tail)))


def _allowed(node: nodes.Node, part: str, target: str) -> bool:
    """Whether ``node`` may appear in ``part`` (head, body or tail; module docstring)."""
    if isinstance(node, nodes.Getattr) and _is_name(node.node, "loop"):
        return part == "body" and node.attr in _LOOP_ATTRS
    if isinstance(node, nodes.Getitem) and _is_name(node.node, "messages"):
        return part != "tail" and isinstance(node.arg, nodes.Const) and node.arg.value == 0
    if isinstance(node, nodes.Name):
        if node.name == "add_generation_prompt":
            return part == "tail"
        return node.name not in _RESERVED and (node.name != target or part == "body")
    if isinstance(node, nodes.Assign):
        ok = isinstance(node.target, nodes.Name)
    elif isinstance(node, nodes.Call):
        ok = isinstance(node.node, nodes.Getattr) or (
            isinstance(node.node, nodes.Name) and node.node.name in _CALLABLE)
    elif isinstance(node, nodes.Filter):
        ok = node.name != "random"
    elif isinstance(node, nodes.Continue):
        ok = part == "body"
    else:
        ok = isinstance(node, _NODES)
    return ok and all(_allowed(child, part, target) for child in node.iter_child_nodes())


def _is_name(node: nodes.Node | None, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.name == name


class _ShiftLoop(NodeTransformer):
    """``loop.index``/``index0`` + start; ``loop.first`` only when start is 0."""

    def visit_Getattr(self, node: nodes.Getattr) -> nodes.Node:
        """Shift a ``loop`` attribute; visit anything else's children."""
        if not _is_name(node.node, "loop"):
            return self.generic_visit(node)
        start = nodes.Name(_START, "load")
        if node.attr == "first":
            return nodes.And(node, nodes.Compare(start, [nodes.Operand("eq", nodes.Const(0))]))
        return nodes.Add(node, start)


def _window_tree(env: jinja2.Environment, head: Sequence[nodes.Node], loop: nodes.For,
                 tail: Sequence[nodes.Node]) -> nodes.Template:
    def mark(name: str) -> nodes.Output:
        return nodes.Output([nodes.Name(name, "load")])

    window_iter = nodes.Getitem(loop.iter, nodes.Slice(nodes.Name(_START, "load"), None, None),
                                "load")
    body = [_ShiftLoop().visit(node) for node in loop.body]
    window = nodes.For(loop.target, window_iter, [mark("rr_item"), *body], [], None, False)
    tree = nodes.Template([*head, mark("rr_head_end"), window, mark("rr_loop_end"), *tail])
    tree.set_environment(env)
    tree.set_lineno(1)
    return tree
