"""The window template: accepted exactly for the templates whose prefix renderings are
prefixes, and for those its head + pieces + tail from any start is the full rendering."""

from __future__ import annotations

import jinja2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix.chat_window import WindowTemplate
from tests.support.chat_templates import FULL_ONLY, INCREMENTAL, chat_tokenizers

TOKENIZERS = chat_tokenizers()
ROLES = st.sampled_from(["system", "user", "assistant"])
CONTENT = st.text(max_size=12) | st.sampled_from(["  padded  ", "hi there", "\n"])
MESSAGES = st.lists(st.fixed_dictionaries({"role": ROLES, "content": CONTENT}),
                    min_size=1, max_size=6)


@pytest.mark.parametrize("name", sorted(INCREMENTAL))
def test_message_local_templates_are_accepted(name):
    assert WindowTemplate.of(INCREMENTAL[name]) is not None


@pytest.mark.parametrize("name", sorted(FULL_ONLY))
def test_templates_that_look_ahead_or_keep_state_are_refused(name):
    assert WindowTemplate.of(FULL_ONLY[name]) is None


def test_a_template_that_does_not_parse_is_refused():
    assert WindowTemplate.of("{% for m in messages %}") is None


@settings(max_examples=100, deadline=None)
@given(messages=MESSAGES, generation=st.booleans(), data=st.data())
def test_any_window_joins_to_the_full_rendering_and_prefixes_render_as_prefixes(
        messages, generation, data):
    for tokenizer, incremental in TOKENIZERS.values():
        if not incremental:
            continue
        window = WindowTemplate.of(tokenizer.chat_template)
        start = data.draw(st.integers(0, len(messages)))
        try:
            full = tokenizer.apply_chat_template(messages, generation)
        except ValueError:
            with pytest.raises(jinja2.TemplateError):
                window.render(tokenizer.chat_variables(messages, generation), 0)
            continue
        whole = window.render(tokenizer.chat_variables(messages, generation), 0)
        part = window.render(tokenizer.chat_variables(messages, generation), start)
        assert whole.head + "".join(whole.pieces) + whole.tail == full
        assert part.pieces == whole.pieces[start:] and (part.head, part.tail) == (
            whole.head, whole.tail)
        if start:
            prefix = window.render(tokenizer.chat_variables(messages[:start], generation), 0)
            assert prefix.pieces == whole.pieces[:start] and prefix.head == whole.head
