"""Typed, path-aware reading of decoded TOML tables for ``router.config``.

A ``Table`` hands out values by key with their type checked, remembers which keys
were read, and ``finish()`` rejects the rest, so every error names the exact field
(``auth.tenants.alice.max_prompt_tokens: ...``) and no typo passes silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

_REQUIRED: Any = object()


class Table:
    """One TOML table at dotted ``path``; a missing table reads as empty."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            raise ValueError(f"{path or 'config'}: must be a table")
        self._data = data
        self._used: set[str] = set()
        self.path = path

    def where(self, key: str) -> str:
        """The dotted path of ``key`` in this table."""
        return f"{self.path}.{key}" if self.path else key

    def names(self) -> list[str]:
        """All keys, each counted as read (for tables of named entries)."""
        self._used.update(self._data)
        return list(self._data)

    def _get(self, key: str, default: Any) -> Any:
        self._used.add(key)
        if key in self._data:
            return self._data[key]
        if default is _REQUIRED:
            raise ValueError(f"{self.where(key)}: required")
        return default

    def table(self, key: str) -> Table:
        """A sub-table (empty when absent)."""
        return Table(self._get(key, {}), self.where(key))

    def array(self, key: str) -> list[Table]:
        """An array of tables (empty when absent)."""
        items = self._get(key, [])
        if not isinstance(items, list):
            raise ValueError(f"{self.where(key)}: must be an array of tables")
        return [Table(item, f"{self.where(key)}[{i}]") for i, item in enumerate(items)]

    def text(self, key: str, default: Any = _REQUIRED) -> Any:
        """A non-empty string, or ``default`` when absent."""
        value = self._get(key, default)
        if value is not default and (not isinstance(value, str) or not value):
            raise ValueError(f"{self.where(key)}: must be a non-empty string")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        """A boolean, or ``default`` when absent."""
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise ValueError(f"{self.where(key)}: must be true or false")
        return value

    def integer(self, key: str, default: Any = _REQUIRED, low: int | None = None) -> Any:
        """An integer ``>= low``, or ``default`` when absent."""
        value = self._get(key, default)
        if value is default:
            return value
        if type(value) is not int:
            raise ValueError(f"{self.where(key)}: must be an integer")
        if low is not None and value < low:
            raise ValueError(f"{self.where(key)}: must be at least {low}")
        return value

    def number(self, key: str) -> float:
        """A required int or float."""
        value = self._get(key, _REQUIRED)
        if type(value) not in (int, float):
            raise ValueError(f"{self.where(key)}: must be a number")
        return float(value)

    def floats(self, keys: Iterable[str]) -> dict[str, float]:
        """The given keys that are present, as positive floats (absent keys keep the
        dataclass default)."""
        out = {}
        for key in keys:
            if key in self._data:
                value = self.number(key)
                if value <= 0:
                    raise ValueError(f"{self.where(key)}: must be positive")
                out[key] = value
            self._used.add(key)
        return out

    def strings(self, key: str) -> tuple[str, ...] | None:
        """An array of strings, or None when absent."""
        value = self._get(key, None)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{self.where(key)}: must be an array of strings")
        return tuple(value)

    def token_ids(self, key: str) -> tuple[int, ...] | None:
        """A non-empty array of token ids in [0, 2**32), or None when absent."""
        value = self._get(key, None)
        if value is None:
            return None
        if (
            not isinstance(value, list)
            or not value
            or not all(type(v) is int and 0 <= v < 2**32 for v in value)
        ):
            raise ValueError(f"{self.where(key)}: must be a non-empty array of token ids")
        return tuple(value)

    def finish(self) -> None:
        """Raise ValueError naming the first key that was never read."""
        unknown = sorted(set(self._data) - self._used)
        if unknown:
            raise ValueError(f"{self.where(unknown[0])}: unknown key")
