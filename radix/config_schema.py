"""One way to declare, validate and read a configuration section, router and workers.

A section is a frozen dataclass deriving from ``Section``. Each field's annotation
is its type; ``setting(default, low=..., high=..., above=..., choices=...,
pattern=..., key=..., flag=..., help=...)`` adds bounds, allowed values, a name
pattern, the TOML key when it differs from the field name, and the command-line
flag that overrides it with its help (``radix.config_flags`` builds the parser
from them). Constructing a section validates every field (and coerces: a list to
a tuple, an int to a float, a table to a read-only mapping); ``check`` adds the
rules between fields. A bad value raises ``FieldError`` (a
``ValueError``) naming the field.

``read_section`` builds a section from a decoded TOML table: unknown keys are
errors (a typo never falls back silently to a default), nested sections and arrays
of sections are read recursively, and every error is a ``ValueError`` whose message
starts with the dotted path of the bad field (``workers[1].kind: must be one of
...``). The name, digest and environment-variable patterns live here, once.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar


class Pattern(NamedTuple):
    """A text pattern with what it means, for the message when a value misses it."""

    regex: re.Pattern[str]
    what: str


NAME = Pattern(re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"),
               "a name (letters, digits, '.', '_', '-'; at most 64)")
DIGEST = Pattern(re.compile(r"^[0-9a-f]{64}$"),
                 "a key digest (64 lowercase hex characters from `python -m router hash-key`)")
ENV_NAME = Pattern(re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"),
                   "an environment variable name (letters, digits, '_')")


class FieldError(ValueError):
    """A bad value of field ``field`` (None: of the section as a whole); ``sub`` names
    the part inside it (``[2]``, ``.x``). The message reads ``section.field: ...``."""

    def __init__(self, field: str | None, message: str, sub: str = "") -> None:
        super().__init__(message)
        self.field, self.message, self.sub = field, message, sub
        self.section = ""

    def __str__(self) -> str:
        where = _join(self.section, f"{self.field}{self.sub}" if self.field else "")
        return f"{where}: {self.message}" if where else self.message


@dataclasses.dataclass(frozen=True)
class Spec:
    """The rules of one field beyond its type, and its flag (see ``setting``)."""

    low: float | None = None
    high: float | None = None
    above: float | None = None
    choices: tuple[object, ...] | None = None
    pattern: Pattern | None = None
    key: str | None = None
    flag: str | None = None
    help: str | None = None
    parse: Callable[[str], object] | None = None
    metavar: str | None = None
    const: object = None


_DEFAULT_SPEC = Spec()


def setting(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
            low: float | None = None, high: float | None = None, above: float | None = None,
            choices: tuple[object, ...] | None = None, pattern: Pattern | None = None,
            key: str | None = None, flag: str | None = None, help: str | None = None,
            parse: Callable[[str], object] | None = None, metavar: str | None = None,
            const: object = None) -> Any:
    """A dataclass field with rules: ``low <= value <= high``, ``value > above``, one
    of ``choices``, matching ``pattern`` (for arrays: every item), read from TOML key
    ``key`` (default: the field name). No default makes the key required. ``flag``
    (``--x-y``) overrides the field from the command line, described by ``help``;
    ``parse`` reads its text (default: by the field's type), ``metavar`` names its
    value, and ``const`` makes it a switch setting that value (see
    ``radix.config_flags``)."""
    spec = Spec(low, high, above, choices, pattern, key, flag, help, parse, metavar, const)
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"spec": spec})


class Section:
    """Base of a config section (a frozen dataclass): validates every field on
    construction. ``section`` (a class keyword) names it in errors of directly built
    instances; ``read_section`` names the real path."""

    _section_name = ""

    def __init_subclass__(cls, section: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._section_name = section

    def __post_init__(self) -> None:
        try:
            for f in dataclasses.fields(self):  # type: ignore[arg-type]
                value = _validated(getattr(self, f.name), _hints(type(self))[f.name],
                                   f.metadata.get("spec", _DEFAULT_SPEC), f.name)
                object.__setattr__(self, f.name, value)
            self.check()
        except FieldError as exc:
            exc.section = self._section_name
            raise

    def check(self) -> None:
        """Rules between fields; raise ``FieldError`` naming the field at fault."""


S = TypeVar("S", bound=Section)


def read_section(cls: type[S], data: object, path: str, base: S | None = None,
                 **given: Any) -> S:
    """``cls`` from the TOML table ``data`` at dotted ``path``: its keys over ``base``
    (or the defaults), ``given`` fields set by the caller (not TOML keys; errors in
    them name the table). ValueError naming the path on an unknown key, a missing
    required one or a bad value."""
    table = _table(data, path)
    by_key = {(f.metadata.get("spec", _DEFAULT_SPEC).key or f.name): f
              for f in dataclasses.fields(cls) if f.name not in given}  # type: ignore[arg-type]
    unknown = sorted(set(table) - set(by_key))
    if unknown:
        raise ValueError(f"{_join(path, unknown[0])}: unknown key (known: "
                         f"{', '.join(sorted(by_key))})")
    values = dict(given)
    for key, f in by_key.items():
        if key in table:
            inner = None if base is None else getattr(base, f.name)
            values[f.name] = _read(table[key], _hints(cls)[f.name], _join(path, key), inner)
        elif base is None and f.default is f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{_join(path, key)}: required")
    try:
        return cls(**values) if base is None else dataclasses.replace(base, **values)
    except FieldError as exc:
        keys = {f.name: key for key, f in by_key.items()}
        exc.section, exc.field = path, keys.get(exc.field or "")
        raise ValueError(str(exc)) from None


def table_array(data: Mapping[str, object], key: str, path: str) -> list[tuple[object, str]]:
    """The items of the array of tables ``data[key]`` (empty when absent), each with
    its path ``path.key[i]``."""
    return _array(data.get(key, []), _join(path, key))


def _array(items: object, where: str) -> list[tuple[object, str]]:
    if not isinstance(items, list):
        raise ValueError(f"{where}: must be an array of tables")
    return [(item, f"{where}[{i}]") for i, item in enumerate(items)]


def named_tables(data: Mapping[str, object], key: str, path: str
                 ) -> list[tuple[str, object, str]]:
    """The entries of the table of named tables ``data[key]`` (empty when absent) as
    (name, table, path ``path.key.name``)."""
    where = _join(path, key)
    return [(name, value, _join(where, name))
            for name, value in _table(data.get(key, {}), where).items()]


def _table(data: object, path: str) -> Mapping[str, object]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{path or 'config'}: must be a table")
    return data


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path and key else path or key


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _read(value: object, hint: Any, where: str, base: Any) -> object:
    """A TOML value for a field: sections and arrays of sections read recursively,
    anything else as given (the constructor validates it)."""
    if isinstance(hint, type) and issubclass(hint, Section):
        return read_section(hint, value, where, base)
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and isinstance(args[0], type) \
            and issubclass(args[0], Section):
        return tuple(read_section(args[0], item, item_where)
                     for item, item_where in _array(value, where))
    return value


def _validated(value: object, hint: Any, spec: Spec, name: str) -> object:
    """``value`` checked against ``hint`` and ``spec`` and coerced; FieldError."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise FieldError(name, f"must be {_describe(hint)}")
        return tuple(_item(v, args[0], spec, name, f"[{i}]") for i, v in enumerate(value))
    if origin is Mapping:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise FieldError(name, f"must be {_describe(hint)}")
        return types.MappingProxyType({k: _item(v, args[1], spec, name, f".{k}")
                                       for k, v in value.items()})
    return _item(value, hint, spec, name, "")


def _item(value: object, hint: Any, spec: Spec, name: str, sub: str) -> object:
    """One scalar (or nested section) checked against its type and ``spec``."""
    if isinstance(hint, type) and issubclass(hint, Section):
        ok = isinstance(value, hint)
    elif hint is float:
        ok = type(value) in (int, float) and _fits_a_float(value)
        value = float(value) if ok else value  # type: ignore[arg-type]
    elif hint is int:
        ok = type(value) is int
    elif hint is str:
        ok = isinstance(value, str) and bool(value)
    elif typing.get_origin(hint) is Mapping:
        ok = isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values())
        value = types.MappingProxyType(dict(value)) if ok else value  # type: ignore[arg-type]
    else:
        ok = isinstance(value, hint)
    if not ok:
        raise FieldError(name, f"must be {_describe(hint)}", sub)
    problem = _bounds_problem(value, spec)
    if problem:
        raise FieldError(name, problem, sub)
    return value


def _fits_a_float(value: int | float) -> bool:
    """Whether ``value`` converts to a float (a JSON or TOML integer may be too large)."""
    try:
        float(value)
    except OverflowError:
        return False
    return True


def _bounds_problem(value: Any, spec: Spec) -> str | None:
    if spec.low is not None and value < spec.low:
        return f"must be at least {spec.low}"
    if spec.high is not None and value > spec.high:
        return f"must be at most {spec.high}"
    if spec.above is not None and value <= spec.above:
        return "must be positive" if spec.above == 0 else f"must be above {spec.above}"
    if spec.choices is not None and value not in spec.choices:
        return f"must be one of {spec.choices}"
    if spec.pattern is not None and not spec.pattern.regex.fullmatch(value):
        return f"{value!r} is not {spec.pattern.what}"
    return None


_NAMES = {str: "a non-empty string", int: "an integer", float: "a number",
          bool: "true or false"}


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        if isinstance(args[0], type) and issubclass(args[0], Section):
            return "an array of tables"
        return f"an array of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is Mapping:
        return f"a table of {_describe(args[1]).removeprefix('a ').removeprefix('an ')}s"
    if isinstance(hint, type) and issubclass(hint, Section):
        return "a table"
    return _NAMES.get(hint, getattr(hint, "__name__", str(hint)))
