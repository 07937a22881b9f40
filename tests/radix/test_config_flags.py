"""Flags generated from config fields (radix.config_flags): one declaration per setting."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import pytest

from radix.config_flags import add_flags, flag_values, flags_table, parse_bytes, with_values
from radix.config_schema import Section, setting


@dataclass(frozen=True)
class ThingSection(Section, section="thing"):
    """A section declared only in this test."""

    x_thing: int = setting(3, low=1, flag="--x-thing", help="how many things to make")
    size: int = setting(0, low=0, flag="--thing-size", parse=parse_bytes, help="bytes")
    names: tuple[str, ...] = setting((), flag="--thing-name", metavar="NAME", help="names")
    labels: Mapping[str, str] = setting(default_factory=lambda: MappingProxyType({}),
                                        flag="--thing-label", help="labels")
    shared: bool = setting(True, flag="--no-shared", help="share nothing")
    mode: str = setting("off", choices=("off", "on", "auto"), flag="--thing-mode",
                        const="auto", help="turn it on by itself")
    unflagged: float = 1.0


@dataclass(frozen=True)
class Root(Section):
    """A config of one section."""

    thing: ThingSection = field(default_factory=ThingSection)


def parsed(*flags: str) -> Root:
    parser = argparse.ArgumentParser(prog="t")
    add_flags(parser, Root)
    return with_values(Root(), flag_values(parser.parse_args(list(flags)), Root))


def test_a_new_setting_line_is_a_flag_in_help_and_parses_into_the_config(capsys) -> None:
    parser = argparse.ArgumentParser(prog="t")
    add_flags(parser, Root)
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--x-thing X_THING how many things to make [thing.x_thing, default 3]" in shown
    assert "[thing]" in shown and "unflagged" not in shown
    assert parsed("--x-thing", "7").thing.x_thing == 7
    assert parsed().thing == ThingSection(), "a flag not given leaves the field alone"


def test_each_kind_of_field_reads_its_flag() -> None:
    thing = parsed("--thing-size", "2KiB", "--thing-name", "a", "b", "--thing-label", "k=v",
                   "--no-shared", "--thing-mode").thing
    assert (thing.size, thing.names, dict(thing.labels)) == (2048, ("a", "b"), {"k": "v"})
    assert (thing.shared, thing.mode) == (False, "auto")


def test_a_bad_value_names_the_field() -> None:
    with pytest.raises(ValueError, match="^thing.x_thing: must be at least 1$"):
        parsed("--x-thing", "0")


@pytest.mark.parametrize(("flags", "message"), [
    (["--x-thing", "many"], "argument --x-thing: invalid int value: 'many'"),
    (["--thing-size", "16 gigs"], "argument --thing-size: invalid parse_bytes value"),
    (["--thing-label", "k"], "argument --thing-label: expected KEY=VALUE, got 'k'"),
])
def test_text_that_does_not_parse_exits_with_status_2(capsys, flags, message) -> None:
    with pytest.raises(SystemExit) as done:
        parsed(*flags)
    assert done.value.code == 2 and message in capsys.readouterr().err


def test_the_docs_table_lists_every_flag_with_its_key_and_default() -> None:
    table = flags_table(Root).splitlines()
    assert table[2] == "| `--x-thing` | `thing.x_thing` | 3 | how many things to make |"
    assert "| `--thing-name NAME` | `thing.names` | none | names |" in table
    assert "| `--no-shared` | `thing.shared` | on | share nothing |" in table
    assert len(table) == 2 + 6
