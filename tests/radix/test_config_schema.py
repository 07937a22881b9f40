"""radix.config_schema: a section validates on construction; read_section names paths."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from radix.config_schema import NAME, FieldError, Section, read_section, setting


@dataclass(frozen=True)
class Inner(Section, section="inner"):
    size: int = setting(4, low=1)
    ratio: float = setting(0.5, above=0, high=1)
    mode: str = setting("a", choices=("a", "b"))


@dataclass(frozen=True)
class Outer(Section):
    name: str = setting(pattern=NAME, key="id")
    tags: tuple[str, ...] = ()
    weights: Mapping[str, float] = setting(default_factory=dict)
    inner: Inner = field(default_factory=Inner)
    items: tuple[Inner, ...] = ()
    limit: int | None = None

    def check(self) -> None:
        if self.limit is not None and self.limit < self.inner.size:
            raise FieldError("limit", "must be at least inner.size")


def test_construction_validates_and_coerces() -> None:
    inner = Inner(ratio=1)
    assert inner.ratio == 1.0 and isinstance(inner.ratio, float)
    outer = Outer(name="x", tags=["a", "b"], weights={"w": 2})  # type: ignore[arg-type]
    assert outer.tags == ("a", "b") and outer.weights["w"] == 2.0
    with pytest.raises(TypeError):
        outer.weights["v"] = 1.0  # type: ignore[index]
    with pytest.raises(ValueError, match=r"^inner\.size: must be at least 1$"):
        Inner(size=0)
    with pytest.raises(ValueError, match=r"^inner\.size: must be an integer$"):
        Inner(size=True)  # a bool is not an int


@pytest.mark.parametrize(("data", "message"), [
    ({}, "top.id: required"),
    ({"id": "x", "nme": 1}, "top.nme: unknown key (known: id, inner, items, limit, tags, weights)"),
    ({"id": "a b"}, "top.id: 'a b' is not a name"),
    ({"id": "x", "tags": ["a", ""]}, "top.tags[1]: must be a non-empty string"),
    ({"id": "x", "weights": {"w": "heavy"}}, "top.weights.w: must be a number"),
    ({"id": "x", "inner": {"ratio": 2}}, "top.inner.ratio: must be at most 1"),
    ({"id": "x", "inner": {"mode": "c"}}, "top.inner.mode: must be one of ('a', 'b')"),
    ({"id": "x", "inner": 3}, "top.inner: must be a table"),
    ({"id": "x", "items": [{}, {"size": "2"}]}, "top.items[1].size: must be an integer"),
    ({"id": "x", "items": {}}, "top.items: must be an array of tables"),
    ({"id": "x", "limit": 2}, "top.limit: must be at least inner.size"),
])
def test_read_section_names_the_dotted_path(data: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        read_section(Outer, data, "top")
    assert str(info.value).startswith(message)


def test_read_section_over_a_base_and_given_fields() -> None:
    base = read_section(Outer, {"id": "x", "inner": {"size": 2, "mode": "b"}}, "")
    changed = read_section(Outer, {"inner": {"size": 3}}, "", base=base)
    assert (changed.name, changed.inner.size, changed.inner.mode) == ("x", 3, "b")
    with pytest.raises(ValueError, match=r"^named: 'a b' is not a name"):
        read_section(Outer, {}, "named", name="a b")
