"""Command-line flags generated from config fields: one declaration per setting.

A field declared ``setting(..., flag="--x-y", help="...")`` (``radix.config_schema``)
is overridden by that flag. ``add_flags`` adds one argparse argument per flagged
field of a section tree, grouped by section: its value is read by the field's
``parse`` callable, else by its type (``int``, ``float``, text); an array takes one
or more values, a table one or more ``KEY=VALUE``; a ``bool`` is a switch (a
``--no-...`` flag sets False, any other True) and a field with ``const`` a switch
setting that value; ``choices`` are offered as the field's. A flag not given is
None and leaves the field as the config file has it.

``flag_values`` collects the given flags as ``{section path: {field: value}}`` and
``with_values`` puts such values on a loaded config with ``dataclasses.replace``, so
every section is validated again and a bad value is a ``ValueError`` naming
``section.field``. ``flags_table`` is the Markdown table of the flags, for the docs.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeVar

from radix.config_schema import FieldError, Section, Spec

S = TypeVar("S", bound=Section)

_BYTE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}


class FlaggedField(NamedTuple):
    """One field with a flag: its section's dotted path (``""``: the root), its name,
    its rules and flag, its type (None removed) and its default."""

    path: str
    name: str
    spec: Spec
    hint: Any
    default: object

    @property
    def dest(self) -> str:
        """The argparse destination of the flag (``--x-y``: ``x_y``)."""
        return (self.spec.flag or "").removeprefix("--").replace("-", "_")

    @property
    def metavar(self) -> str | None:
        """The name of the flag's value in help: the spec's, ``KEY=VALUE`` for a table,
        else None (argparse's default)."""
        if self.spec.metavar is None and typing.get_origin(self.hint) is Mapping:
            return "KEY=VALUE"
        return self.spec.metavar

    @property
    def key(self) -> str:
        """The dotted config key, ``section.field``."""
        return f"{self.path}.{self.name}" if self.path else self.name


def flagged_fields(cls: type[Section], path: str = "") -> list[FlaggedField]:
    """Every field with a flag of ``cls`` and of the sections nested in it (not those
    in arrays or tables), in declaration order."""
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        hint = _without_none(hints[f.name])
        if isinstance(hint, type) and issubclass(hint, Section):
            found += flagged_fields(hint, f"{path}.{f.name}" if path else f.name)
            continue
        spec = f.metadata.get("spec")
        if spec is not None and spec.flag is not None:
            default = f.default if f.default_factory is dataclasses.MISSING \
                else f.default_factory()
            found.append(FlaggedField(path, f.name, spec, hint, default))
    return found


def add_flags(parser: argparse.ArgumentParser, cls: type[Section]
              ) -> dict[str, argparse._ArgumentGroup]:
    """One argument per flagged field of ``cls``, in a group per section (titled
    ``[path]``, returned by path for the caller's own flags), each help ending with
    the config key it sets and that key's default."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for field in flagged_fields(cls):
        if field.path not in groups:
            groups[field.path] = parser.add_argument_group(f"[{field.path or 'config'}]")
        groups[field.path].add_argument(field.spec.flag, **_argument(field))
    return groups


def _argument(field: FlaggedField) -> dict[str, Any]:
    """The ``add_argument`` keywords of one flagged field (see the module doc)."""
    spec, hint = field.spec, field.hint
    kwargs: dict[str, Any] = {
        "dest": field.dest,
        "help": f"{spec.help or ''} [{field.key}, default {_shown(field.default)}]".lstrip()}
    const = spec.const
    if const is None and hint is bool:
        const = not (spec.flag or "").startswith("--no-")
    if const is not None:
        return {**kwargs, "action": "store_const", "const": const}
    origin = typing.get_origin(hint)
    if origin in (tuple, Mapping):
        kwargs["nargs"] = "+"
    item = typing.get_args(hint)[0] if origin is tuple else hint
    parse = spec.parse or (parse_key_value if origin is Mapping else _PARSERS.get(item))
    if parse is not None:
        kwargs["type"] = parse
    if spec.choices is not None:
        kwargs["choices"] = spec.choices
    kwargs["metavar"] = field.metavar
    return kwargs


def flag_values(args: argparse.Namespace, cls: type[Section]) -> dict[str, dict[str, object]]:
    """The flags of ``cls`` given in ``args`` as ``{section path: {field: value}}``
    (a table flag's ``KEY=VALUE`` items as a dict)."""
    values: dict[str, dict[str, object]] = {}
    for field in flagged_fields(cls):
        value = getattr(args, field.dest)
        if value is not None:
            if typing.get_origin(field.hint) is Mapping:
                value = dict(value)
            values.setdefault(field.path, {})[field.name] = value
    return values


def with_values(config: S, values: Mapping[str, Mapping[str, object]]) -> S:
    """``config`` with ``{section path: {field: value}}`` replaced, each section (and
    those holding it) built again and so validated; ValueError naming
    ``section.field`` on a bad value."""
    for path, fields in values.items():
        config = _replaced(config, path.split(".") if path else [], fields, path)
    return config


def _replaced(section: S, parts: list[str], fields: Mapping[str, object], path: str) -> S:
    if parts:
        inner = _replaced(getattr(section, parts[0]), parts[1:], fields, path)
        return dataclasses.replace(section, **{parts[0]: inner})  # type: ignore[type-var]
    try:
        return dataclasses.replace(section, **fields)  # type: ignore[type-var]
    except FieldError as exc:
        exc.section = path
        raise ValueError(str(exc)) from None


def flags_table(cls: type[Section]) -> str:
    """The Markdown table of the flags of ``cls``: flag, config key, default, help."""
    rows = ["| flag | config key | default | meaning |", "|---|---|---|---|"]
    for field in flagged_fields(cls):
        value = f" {field.metavar}" if field.metavar else ""
        default = _shown(field.default)
        default = f"`{default}`" if isinstance(field.default, str) else default
        rows.append(f"| `{field.spec.flag}{value}` | `{field.key}` | {default} | "
                    f"{field.spec.help or ''} |")
    return "\n".join(rows) + "\n"


def _shown(default: object) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, (tuple, Mapping)) and not default:
        return "none"
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def parse_bytes(text: str) -> int:
    """``16GiB`` -> 17179869184; accepts B, KB/MB/GB/TB (powers of 10),
    KiB/MiB/GiB/TiB. ValueError on anything else."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not found or found.group(2).lower() not in _BYTE_UNITS:
        raise ValueError(f"not a byte size: {text!r} (e.g. 16GiB, 500MB, 1048576)")
    return int(float(found.group(1)) * _BYTE_UNITS[found.group(2).lower()])


def parse_key_value(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` as ``(KEY, VALUE)``; argparse's error naming the flag otherwise."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


_PARSERS: dict[Any, Any] = {int: int, float: float}


def _without_none(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint
