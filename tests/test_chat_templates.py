"""Chat templates rendered in poot's sandbox equal transformers' apply_chat_template, and bad
templates or inputs give a ChatTemplateError instead of a traceback."""

from __future__ import annotations

import pytest

from poot.load import open_checkpoint
from poot.models import family_for
from poot.testing.references import hf_tokenizer
from poot.text.chat import ChatTemplate, ChatTemplateError

transformers = pytest.importorskip("transformers", reason="transformers is the chat-template oracle")

SYSTEM = {"role": "system", "content": "You are terse. Answer in one line."}
CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "user", "content": "Why is the sky blue?"}],
    [SYSTEM, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi, how can I help?"}, {"role": "user", "content": "Tell me a joke."}],
    [
        SYSTEM,
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
        {"role": "user", "content": "e"},
    ],
    [{"role": "user", "content": "  spaces around  \n"}],
    [{"role": "user", "content": "unicode: 日本語 🤖 ñ"}],
    [{"role": "user", "content": "code:\n```py\nprint('x')\n```"}],
    [{"role": "user", "content": '<b>html</b> & "quotes"'}, {"role": "assistant", "content": "ok"}],
    [SYSTEM, {"role": "user", "content": "multi\nline\n\nprompt"}, {"role": "assistant", "content": "answer\nwith lines"}],
    [{"role": "user", "content": [{"type": "text", "text": "content as parts"}]}],
]


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def both(request):
    path = request.getfixturevalue(f"{request.param}_path")
    ck = open_checkpoint(path)
    family = family_for(ck.architecture)
    tok = family.tokenizer(ck)
    source = ck.chat_template or family.default_chat_template  # Gemma 3 270M carries none: its family's
    ours = ChatTemplate(source, tok.special_tokens)
    ref = hf_tokenizer(path)
    return request.param, ours, ref, source


@pytest.mark.parametrize("gen", [True, False])
def test_rendering_equals_transformers(both, gen):
    name, ours, ref, source = both
    n = 0
    for conv in CONVERSATIONS:
        if name == "smollm2" and isinstance(conv[-1]["content"], list):
            continue  # SmolLM2's template concatenates content as a string
        want = ref.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen, chat_template=source)
        assert ours.render(conv, add_generation_prompt=gen) == want, (name, conv)
        n += 1
    assert n >= 10


def test_gemma_template_enforces_alternation():
    ours = ChatTemplate(family_for("gemma3").default_chat_template, {"bos_token": "<bos>"})
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate"):
        ours.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_template_errors_are_typed():
    with pytest.raises(ChatTemplateError, match="line 1"):
        ChatTemplate("{% for x in %}")
    with pytest.raises(ChatTemplateError, match="custom failure"):
        ChatTemplate("{{ raise_exception('custom failure') }}").render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="messages\\[0\\] must be an object with a 'role'"):
        ChatTemplate("{{ messages }}").render([{"content": "no role"}])
    with pytest.raises(ChatTemplateError, match="cannot be passed"):
        ChatTemplate("{{ messages }}").render([{"role": "user", "content": object()}])
    for overflowing in ("{{ range(100001) | list | length }}", "{{ 2.0 ** 5000 }}"):  # (OverflowError had escaped)
        with pytest.raises(ChatTemplateError, match="OverflowError"):
            ChatTemplate(overflowing).render([{"role": "user", "content": "x"}])


def test_sandbox_blocks_escapes():
    escapes = [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ messages.append(1) }}",
        "{{ messages.pop() }}",
        "{{ cycler.__init__.__globals__ }}",
    ]
    for src in escapes:
        with pytest.raises(ChatTemplateError, match="unsafe|underscore"):
            ChatTemplate(src).render([{"role": "user", "content": "x"}])
    # reading an unsafe attribute without using it yields nothing rather than the object
    assert ChatTemplate("{{ messages.__class__ }}").render([{"role": "user", "content": "x"}]) == ""


def test_tools_documents_and_tojson():
    t = ChatTemplate(
        "{% for t in tools %}{{ t | tojson }}{% endfor %}|{{ documents[0].title }}|{{ strftime_now('%Y') | length }}|{% generation %}gen{% endgeneration %}"
    )
    out = t.render([{"role": "user", "content": "x"}], tools=[{"name": "f", "d": "<é>"}], documents=[{"title": "T", "text": "b"}])
    assert out == '{"name": "f", "d": "<é>"}|T|4|gen'
