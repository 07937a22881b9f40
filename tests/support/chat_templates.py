"""Every chat template the project packages or tests, plus shapes real templates use,
each with whether ``radix.chat_window`` may render it incrementally."""

from __future__ import annotations

from radix.tokenizer import DEMO_CHAT_TEMPLATE, PromptTokenizer
from tests.radix.test_chat_text import TRIMMING_TEMPLATE
from tests.radix.test_tokenizer import RICH_TEMPLATE
from tests.support.bpe import merging_bpe
from tests.support.tokenizers import packaged_smollm2

# A system head from messages[0], loop.first/index/index0, continue, set, a filter,
# tojson and the generation tag: every construct the window template rewrites or keeps.
HEADED_TEMPLATE = (
    "{{ bos_token }}{% set system = messages[0]['content'] if messages[0]['role'] == "
    "'system' else 'default' %}[{{ system | trim }}]"
    "{% for message in messages %}{% if message['role'] == 'system' %}{% continue %}"
    "{% endif %}{% set n = loop.index0 %}{% if loop.first %}<first>{% endif %}"
    "{% if message['role'] not in ['user', 'assistant'] %}"
    "{{ raise_exception('role ' + message['role']) }}{% endif %}"
    "<{{ message['role'] }} {{ n }}/{{ loop.index }}>{% generation %}"
    "{{ message['content'] | trim }}{% endgeneration %}{{ {'n': n} | tojson }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}{{ eos_token }}"
)
INCREMENTAL = {
    "demo": DEMO_CHAT_TEMPLATE,
    "trimming": TRIMMING_TEMPLATE,
    "headed": HEADED_TEMPLATE,
}
FULL_ONLY = {
    "rich (namespace counter)": RICH_TEMPLATE,
    "first message only (no loop)": "{{ messages[0]['content'] }}!",
    "loop.last": "{% for m in messages %}{{ m['content'] }}{% if loop.last %}<last>"
                 "{% endif %}{% endfor %}",
    "messages|length": "{{ messages | length }}{% for m in messages %}{{ m['content'] }}"
                       "{% endfor %}",
    "last message in the head": "{{ messages[-1]['content'] }}{% for m in messages %}"
                                "{{ m['content'] }}{% endfor %}",
    "generation prompt in the body": "{% for m in messages %}{{ m['content'] }}"
                                     "{% if add_generation_prompt %}?{% endif %}{% endfor %}",
    "break": "{% for m in messages %}{% if m['role'] == 'tool' %}{% break %}{% endif %}"
             "{{ m['content'] }}{% endfor %}",
    "filtered loop": "{% for m in messages if m['role'] != 'system' %}{{ m['content'] }}"
                     "{% endfor %}",
    "date": "{{ strftime_now('%Y') }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
    "nested loop": "{% for m in messages %}{% for c in m['content'] %}{{ c }}{% endfor %}"
                   "{% endfor %}",
}


def chat_tokenizers() -> dict[str, tuple[PromptTokenizer, bool]]:
    """name -> (a tokenizer with that template, whether it renders incrementally):
    trained byte-level BPEs for the templates above, SmolLM2's own where installed."""
    corpus = ["the user said hi to the system", "héllo wörld 😀 " * 3, "<first> [default]"]
    found = {name: (merging_bpe(corpus, source), True) for name, source in INCREMENTAL.items()}
    found["demo tokenizer"] = (PromptTokenizer.demo(), True)
    found.update({name: (merging_bpe(corpus, source), False)
                  for name, source in FULL_ONLY.items()})
    smollm2 = packaged_smollm2()
    if smollm2 is not None:
        found["smollm2"] = (smollm2, True)
    return found
